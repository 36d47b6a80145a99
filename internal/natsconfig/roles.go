// Package natsconfig owns who may do what on NATS: the permission table of Boxcar's roles
// (submitter and approver of a tenant, worker, operator), and the generator that turns it into
// a nats-server configuration (operator, accounts and a memory resolver, in JWT mode) and one
// .creds file per identity. It does not connect to NATS; the server enforces what it writes.
package natsconfig

import (
	"fmt"
	"slices"
	"strings"

	"github.com/boxcar-run/boxcar/internal/config"
)

// Role is a kind of identity. Submitter and Approver exist once per tenant.
type Role string

// The roles, in the order the docs and the generated files list them.
const (
	Submitter Role = "submitter"
	Approver  Role = "approver"
	Worker    Role = "worker"
	Operator  Role = "operator"
)

// Roles lists every role.
var Roles = []Role{Submitter, Approver, Worker, Operator}

// perTenant says whether a role exists once per tenant.
func (r Role) perTenant() bool { return r == Submitter || r == Approver }

// Names are the JetStream names the permissions are written for: the worker config's, with
// the layout's fixed buckets.
type Names struct {
	JobStream, JobSubject, Consumer, DeadLetterStream                        string
	StatusBucket, ApprovalsBucket, CancelBucket, ProfilesBucket, UsageBucket string
}

// NamesOf takes the names from a worker config's NATS section (defaults filled).
func NamesOf(n config.NATS) Names {
	return Names{
		JobStream: n.Stream, JobSubject: n.Subject, Consumer: n.Consumer, DeadLetterStream: n.DeadLetterStream,
		StatusBucket: n.StatusBucket, ApprovalsBucket: n.ApprovalsBucket,
		CancelBucket: "BOXCAR_CANCEL", ProfilesBucket: "BOXCAR_PROFILES", UsageBucket: "BOXCAR_USAGE",
	}
}

// Grant is one thing the roles it names may do, as subject templates they may publish and
// subscribe to. A template's {placeholders} are Names, {tenant} and {inbox} (see expand); one
// with {each} stands for one subject per tenant (a * matches whole tokens only, so
// boxcar-workers-* would match no consumer).
type Grant struct {
	Roles []Role
	What  string
	Pub   []string
	Sub   []string
}

// kvRead is what a tenant's identity may read of a bucket (keys: a subject pattern below
// $KV.<bucket>.): look the bucket up, which also lists its keys (STREAM.INFO with a subject
// filter), and get a key's last value by a direct get with the key in the subject, which the
// server checks (the form with the key in the payload is never granted). It creates no
// consumer: a consumer's deliver subject is checked against no permission (nats-server issue
// #8274), and the server delivers into any subject some subscription holds exactly, such as
// another tenant's job consumer's next-message and reset subjects. So a tenant lists and
// polls; it never watches.
func kvRead(bucket, keys string) []string {
	return streamRead("KV_"+bucket, "$KV."+bucket+"."+keys)
}

// streamRead is kvRead for a stream and a subject filter of it.
func streamRead(stream, filter string) []string {
	return []string{
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.DIRECT.GET." + stream + "." + filter,
	}
}

// kvWatch is kvRead for the worker, which is trusted with every tenant's jobs and watches
// keys (cancel requests, approval answers): an ordered consumer whose filter is in the
// subject, its flow control replies, and deleting it when the watch ends. Only the buckets the
// worker watches grant it: it reads and writes statuses and usage by key.
func kvWatch(bucket, keys string) []string {
	stream, filter := "KV_"+bucket, "$KV."+bucket+"."+keys
	return append(streamRead(stream, filter),
		"$JS.API.CONSUMER.CREATE."+stream+".*."+filter,
		"$JS.API.CONSUMER.DELETE."+stream+".*",
		"$JS.FC."+stream+".>",
	)
}

// kvWrite is putting, creating, updating and deleting keys of a bucket: a publish on the key's
// subject, acknowledged to the inbox.
func kvWrite(bucket, keys string) []string { return []string{"$KV." + bucket + "." + keys} }

func join(lists ...[]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

// inbox is every role's own reply subjects: _INBOX.<its user's public key>.>, which Boxcar's
// clients use as their inbox prefix when they log in with creds or an nkey (queue.Connect), so
// no identity can read the replies another one gets (job bodies, statuses).
const inbox = "_INBOX.{inbox}.>"

// Table is the permission table: every grant of every role. docs/security.md prints it.
var Table = []Grant{
	// A tenant's stream only: the info of a stream lists the subjects it holds, job ids and all,
	// so a submitter allowed the shared stream's (or another tenant's) would see other tenants'.
	{Roles: []Role{Submitter}, What: "publish a job of its tenant, and look up its tenant's job stream",
		Pub: []string{"{jobs}.{tenant}.*", "$JS.API.STREAM.INFO.{jobstream}_{tenant}"}},
	{Roles: []Role{Submitter}, What: "read its tenant's consumer (jobs waiting, running)",
		Pub: []string{"$JS.API.CONSUMER.INFO.{jobstream}_{tenant}.{consumer}-{tenant}"}},
	// Not the shared stream's info, which lists every tenant's jobs: a direct get of one of its
	// tenant's job subjects, and its tenant's consumer there.
	{Roles: []Role{Submitter}, What: "find its tenant's jobs an older Boxcar queued in the shared job stream, while an upgrade drains it",
		Pub: []string{"$JS.API.DIRECT.GET.{jobstream}.{jobs}.{tenant}.*", "$JS.API.CONSUMER.INFO.{jobstream}.{consumer}-{tenant}"}},
	// Its tenant's bucket only: the info of a bucket lists its keys, job ids and all, so a
	// tenant allowed the shared one's (or another tenant's) would see other tenants'.
	{Roles: []Role{Submitter, Approver}, What: "read and list its tenant's statuses (no consumer: `watch` polls)",
		Pub: kvRead("{status}_{tenant}", "{tenant}.>")},
	// Not the shared bucket's info: a direct get of one of its tenant's keys.
	{Roles: []Role{Submitter, Approver}, What: "read, by its key, a status of its tenant's that an older Boxcar's worker wrote in the shared status bucket, while an upgrade moves them",
		Pub: []string{"$JS.API.DIRECT.GET.KV_{status}.$KV.{status}.{tenant}.>"}},
	{Roles: []Role{Submitter}, What: "request a cancel of its tenant's jobs",
		Pub: join(kvRead("{cancel}_{tenant}", "{tenant}.>"), kvWrite("{cancel}_{tenant}", "{tenant}.>"))},
	// Not the shared bucket's info: a direct get of one of its tenant's keys, and its write.
	{Roles: []Role{Submitter}, What: "request a cancel, by its key, in the shared cancel bucket older workers watch during an upgrade, and read one an older Boxcar's submit asked there",
		Pub: []string{"$JS.API.DIRECT.GET.KV_{cancel}.$KV.{cancel}.{tenant}.>", "$KV.{cancel}.{tenant}.>"}},
	{Roles: []Role{Submitter, Approver}, What: "read and list its tenant's approval requests",
		Pub: kvRead("{approvals}_{tenant}", "{tenant}.>")},
	{Roles: []Role{Approver}, What: "answer its tenant's approval requests (a signed decision)",
		Pub: kvWrite("{approvals}_{tenant}", "{tenant}.>")},
	// Not the shared bucket's info: a direct get of one of its tenant's keys, and its answer.
	{Roles: []Role{Approver}, What: "read, by its key, and answer a request of its tenant's that an older Boxcar's worker asked in the shared approvals bucket, while an upgrade runs",
		Pub: []string{"$JS.API.DIRECT.GET.KV_{approvals}.$KV.{approvals}.{tenant}.>", "$KV.{approvals}.{tenant}.>"}},
	// Its tenant's stream only, as the statuses: the info of the shared one lists every
	// tenant's dead-lettered job ids.
	{Roles: []Role{Submitter}, What: "read and list its tenant's dead letters",
		Pub: streamRead("{dlq}_{tenant}", "{dlq}_{tenant}.>")},
	{Roles: []Role{Submitter}, What: "read, by its job's subject, a dead letter of its tenant's in the shared dead-letter stream (written before the upgrade, or by an older worker during it)",
		Pub: []string{"$JS.API.DIRECT.GET.{dlq}.{dlq}.{tenant}.>"}},
	// Its tenant's bucket only, as the statuses: the info of the shared one lists the days every
	// tenant spent on.
	{Roles: []Role{Submitter}, What: "read its tenant's token spending",
		Pub: kvRead("{usage}_{tenant}", "{tenant}.>")},
	{Roles: []Role{Submitter}, What: "read, by its key, its tenant's day that older workers add to in the shared usage bucket while an upgrade runs",
		Pub: []string{"$JS.API.DIRECT.GET.KV_{usage}.$KV.{usage}.{tenant}.>"}},
	{Roles: []Role{Submitter, Approver, Worker}, What: "read and list the profiles workers offer",
		Pub: kvRead("{profiles}", ">")},
	{Roles: []Role{Worker}, What: "bind every tenant's job stream and fetch, ack, nak, term and extend the jobs of its consumer",
		Pub: []string{
			"$JS.API.STREAM.INFO.{jobstream}_{each}", "$JS.API.CONSUMER.INFO.{jobstream}_{each}.{consumer}-{each}",
			"$JS.API.CONSUMER.MSG.NEXT.{jobstream}_{each}.{consumer}-{each}", "$JS.ACK.{jobstream}_{each}.{consumer}-{each}.>",
		}},
	{Roles: []Role{Worker}, What: "read the tenants `worker setup` retired, and settle the jobs an older Boxcar queued in the shared job stream",
		Pub: []string{
			"$JS.API.STREAM.INFO.{jobstream}", "$JS.API.CONSUMER.INFO.{jobstream}.{consumer}-{each}",
			"$JS.API.CONSUMER.MSG.NEXT.{jobstream}.{consumer}-{each}", "$JS.ACK.{jobstream}.{consumer}-{each}.>",
		}},
	{Roles: []Role{Worker}, What: "hear of every tenant's new jobs while idle (the job stream's notifications, headers only)",
		Sub: []string{"{jobs}-queued.{each}.*"}},
	{Roles: []Role{Worker}, What: "read and write every tenant's statuses",
		Pub: join(kvRead("{status}_{each}", ">"), kvWrite("{status}_{each}", ">"))},
	// An older worker of an upgrade writes there with the worker's login too, regenerated.
	{Roles: []Role{Worker}, What: "read and write the shared status bucket older workers write during an upgrade, and move a status to its tenant's",
		Pub: join(kvRead("{status}", ">"), kvWrite("{status}", ">"))},
	{Roles: []Role{Worker}, What: "watch every tenant's cancel requests, and release them",
		Pub: join(kvWatch("{cancel}_{each}", ">"), kvWrite("{cancel}_{each}", ">"))},
	// An older worker of an upgrade watches there with the worker's login too, regenerated.
	{Roles: []Role{Worker}, What: "watch and release the cancel requests in the shared cancel bucket older Boxcars use during an upgrade",
		Pub: join(kvWatch("{cancel}", ">"), kvWrite("{cancel}", ">"))},
	{Roles: []Role{Worker}, What: "request approvals and read the answers",
		Pub: join(kvWatch("{approvals}_{each}", ">"), kvWrite("{approvals}_{each}", ">"))},
	// An older worker of an upgrade asks there with the worker's login too, regenerated.
	{Roles: []Role{Worker}, What: "request approvals in the shared approvals bucket older workers ask in during an upgrade, and move an answer to its tenant's",
		Pub: join(kvWatch("{approvals}", ">"), kvWrite("{approvals}", ">"))},
	{Roles: []Role{Worker}, What: "dead-letter a job of every tenant, and read a letter back whose publish got no answer",
		Pub: append(streamRead("{dlq}_{each}", "{dlq}_{each}.>"), "{dlq}_{each}.>")},
	// An older worker of an upgrade writes there with the worker's login too, regenerated.
	{Roles: []Role{Worker}, What: "dead-letter a job of a tenant it does not serve (retired, unknown) in the shared dead-letter stream, and read the letters older workers wrote there",
		Pub: append(streamRead("{dlq}", "{dlq}.>"), "{dlq}.>")},
	{Roles: []Role{Worker}, What: "advertise its profiles, count every tenant's tokens spent",
		Pub: join(kvWrite("{profiles}", ">"), kvRead("{usage}_{each}", ">"), kvWrite("{usage}_{each}", ">"))},
	// An older worker of an upgrade adds there with the worker's login too, regenerated.
	{Roles: []Role{Worker}, What: "read and add to the shared usage bucket older workers add to during an upgrade",
		Pub: join(kvRead("{usage}", ">"), kvWrite("{usage}", ">"))},
	{Roles: []Role{Operator}, What: "declare and administer streams, consumers and buckets (`worker setup`, `nats`)",
		Pub: []string{"$JS.API.>"}},
	// A letter's publish is no JetStream API request: without these, each letter of a retired
	// tenant's job was refused, and setup waited for its answer until its deadline.
	{Roles: []Role{Operator}, What: "dead-letter the jobs of a tenant the config no longer lists (`worker setup`): in the tenant's dead-letter stream, else in the shared one",
		Pub: []string{"{dlq}_{each}.>", "{dlq}.>"}},
	// A key's write is no JetStream API request: without it, setup's end of a retired tenant's
	// job, written where an older worker of an upgrade claims it, was refused.
	{Roles: []Role{Operator}, What: "end a job of a tenant the config no longer lists in the shared status bucket older workers claim in during an upgrade (`worker setup`)",
		Pub: kvWrite("{status}", ">")},
	// A key's write is no JetStream API request: without these, setup's copy was refused.
	{Roles: []Role{Operator}, What: "copy what an older Boxcar wrote in a shared bucket into each tenant's own (`worker setup`)",
		Pub: []string{"$KV.{status}_{each}.>", "$KV.{approvals}_{each}.>"}},
	{Roles: []Role{Operator}, What: "read replies to any inbox (the `nats` CLI's default inbox prefix)",
		Sub: []string{"_INBOX.>"}},
	{Roles: []Role{Submitter, Approver, Worker}, What: "receive replies on its own inbox",
		Sub: []string{inbox}},
}

// Permissions are what one identity may publish and subscribe to.
type Permissions struct{ Pub, Sub []string }

// PermissionsOf expands the table for one identity of a deployment with these tenants, whose
// user has the public key userKey (its inbox). Subjects are sorted and unique.
func PermissionsOf(n Names, id Identity, tenants []string, userKey string) Permissions {
	var p Permissions
	for _, g := range Table {
		if slices.Contains(g.Roles, id.Role) {
			p.Pub = append(p.Pub, expandAll(g.Pub, n, id.Tenant, tenants, userKey)...)
			p.Sub = append(p.Sub, expandAll(g.Sub, n, id.Tenant, tenants, userKey)...)
		}
	}
	slices.Sort(p.Pub)
	slices.Sort(p.Sub)
	return Permissions{Pub: slices.Compact(p.Pub), Sub: slices.Compact(p.Sub)}
}

func expandAll(tmpls []string, n Names, tenant string, tenants []string, userKey string) []string {
	var out []string
	for _, s := range tmpls {
		if !strings.Contains(s, "{each}") {
			out = append(out, expand(s, n, tenant, userKey))
			continue
		}
		for _, t := range tenants {
			out = append(out, expand(strings.ReplaceAll(s, "{each}", t), n, tenant, userKey))
		}
	}
	return out
}

// expand fills a template's placeholders.
func expand(tmpl string, n Names, tenant, userKey string) string {
	return strings.NewReplacer(
		"{jobs}", n.JobSubject, "{jobstream}", n.JobStream, "{consumer}", n.Consumer, "{dlq}", n.DeadLetterStream,
		"{status}", n.StatusBucket, "{approvals}", n.ApprovalsBucket, "{cancel}", n.CancelBucket,
		"{profiles}", n.ProfilesBucket, "{usage}", n.UsageBucket, "{tenant}", tenant, "{inbox}", userKey,
	).Replace(tmpl)
}

// DocTable is the permission table as docs/security.md shows it: one row per grant, the
// subjects with the default names, <tenant> for the tenant and <key> for the user's public key.
func DocTable(n Names) string {
	var b strings.Builder
	b.WriteString("| role | may | publish | subscribe |\n| --- | --- | --- | --- |\n")
	for _, g := range Table {
		roles := make([]string, len(g.Roles))
		for i, r := range g.Roles {
			roles[i] = string(r)
			if r.perTenant() {
				roles[i] += " of a tenant"
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", strings.Join(roles, ", "), g.What, docSubjects(g.Pub, n), docSubjects(g.Sub, n))
	}
	return b.String()
}

func docSubjects(tmpls []string, n Names) string {
	if len(tmpls) == 0 {
		return ""
	}
	out := make([]string, len(tmpls))
	for i, s := range tmpls {
		out[i] = "`" + expand(strings.ReplaceAll(s, "{each}", "<each tenant>"), n, "<tenant>", "<key>") + "`"
	}
	return strings.Join(out, "<br>")
}
