//go:build integration

package tenancy

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/natsconfig"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// declare makes the layout's streams, consumers and buckets as the operator (what `worker
// setup` does).
func declare(t *testing.T, op *conn, d *deployment) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := d.names
	if _, err := op.js.CreateStream(ctx, jetstream.StreamConfig{Name: n.JobStream, Subjects: []string{n.JobSubject + "._shared"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	for _, tn := range tenants {
		jobs, err := op.js.CreateStream(ctx, jetstream.StreamConfig{Name: n.JobStream + "_" + tn, Subjects: []string{n.JobSubject + "." + tn + ".*"}, Retention: jetstream.WorkQueuePolicy})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := jobs.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: n.Consumer + "-" + tn, FilterSubject: n.JobSubject + "." + tn + ".*", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	// The shared dead-letter stream: tenants no worker serves, and an older Boxcar's letters.
	if _, err := op.js.CreateStream(ctx, jetstream.StreamConfig{Name: n.DeadLetterStream, Subjects: []string{n.DeadLetterStream + ".*.*"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	for _, tn := range tenants {
		if _, err := op.js.CreateStream(ctx, jetstream.StreamConfig{Name: lettersOf(n, tn), Subjects: []string{lettersOf(n, tn) + ".*"}, AllowDirect: true}); err != nil {
			t.Fatal(err)
		}
	}
	// The shared status, approvals, cancel and usage buckets are an older Boxcar's, which
	// workers of an upgrade still write.
	buckets := []string{n.StatusBucket, n.ApprovalsBucket, n.CancelBucket, n.ProfilesBucket, n.UsageBucket}
	for _, tn := range tenants {
		buckets = append(buckets, statusOf(n, tn), approvalsOf(n, tn), usageOf(n, tn), cancelOf(n, tn))
	}
	for _, b := range buckets {
		if _, err := op.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b, History: 4}); err != nil {
			t.Fatal(err)
		}
	}
}

// statusOf is tenant's status bucket.
func statusOf(n natsconfig.Names, tenant string) string { return n.StatusBucket + "_" + tenant }

// usageOf is tenant's usage bucket.
func usageOf(n natsconfig.Names, tenant string) string { return n.UsageBucket + "_" + tenant }

// cancelOf is tenant's cancel bucket.
func cancelOf(n natsconfig.Names, tenant string) string { return n.CancelBucket + "_" + tenant }

// lettersOf is tenant's dead-letter stream.
func lettersOf(n natsconfig.Names, tenant string) string { return n.DeadLetterStream + "_" + tenant }

// approvalsOf is tenant's approvals bucket.
func approvalsOf(n natsconfig.Names, tenant string) string { return n.ApprovalsBucket + "_" + tenant }

// world is what the operator can see of the layout: every stream's messages and every
// consumer's settings. An attempt the server refused leaves it as it was.
type world map[string]any

func snapshot(t *testing.T, op *conn) world {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := world{}
	names := op.js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := op.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		w["stream "+name] = []any{info.State.Msgs, info.State.LastSeq, info.Config.Subjects}
		cons := s.ListConsumers(ctx)
		for ci := range cons.Info() {
			if ci.Config.Durable != "" { // watches come and go; durable consumers are the layout's
				w["consumer "+name+"/"+ci.Name] = []any{ci.Config.FilterSubject, ci.Config.MaxAckPending, ci.Delivered.Stream}
			}
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return w
}

// attempt is one thing an identity must not be able to do.
type attempt struct {
	name string
	as   string // identity
	try  func(ctx context.Context, c *conn) error
}

// kvOp looks a bucket up and does something with it.
func kvOp(bucket string, f func(ctx context.Context, kv jetstream.KeyValue) error) func(context.Context, *conn) error {
	return func(ctx context.Context, c *conn) error {
		kv, err := c.js.KeyValue(ctx, bucket)
		if err != nil {
			return err
		}
		return f(ctx, kv)
	}
}

func put(bucket, key, value string) func(context.Context, *conn) error {
	return kvOp(bucket, func(ctx context.Context, kv jetstream.KeyValue) error {
		_, err := kv.Put(ctx, key, []byte(value))
		return err
	})
}

func get(bucket, key string) func(context.Context, *conn) error {
	return kvOp(bucket, func(ctx context.Context, kv jetstream.KeyValue) error {
		_, err := kv.Get(ctx, key)
		return err
	})
}

func watch(bucket, keys string) func(context.Context, *conn) error {
	return kvOp(bucket, func(ctx context.Context, kv jetstream.KeyValue) error {
		w, err := kv.Watch(ctx, keys)
		if err != nil {
			return err
		}
		defer func() { _ = w.Stop() }()
		select { // the first update (or the end of the initial values) proves it was created
		case <-w.Updates():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

func publish(subject, msgID string) func(context.Context, *conn) error {
	return func(ctx context.Context, c *conn) error {
		_, err := c.js.Publish(ctx, subject, []byte(`{"id":"x","profile":"p","task":"t"}`), jetstream.WithMsgID(msgID))
		return err
	}
}

func request(subject, body string) func(context.Context, *conn) error {
	return func(ctx context.Context, c *conn) error {
		m, err := c.nc.RequestWithContext(ctx, subject, []byte(body))
		if err != nil {
			return err
		}
		// An answer, even an error of the JetStream API, means the server let it through.
		return fmt.Errorf("answered %s", m.Data)
	}
}

// ask is a request that must be answered.
func ask(subject, body string) func(context.Context, *conn) error {
	return func(ctx context.Context, c *conn) error {
		_, err := c.nc.RequestWithContext(ctx, subject, []byte(body))
		return err
	}
}

func subscribe(subject string) func(context.Context, *conn) error {
	return func(_ context.Context, c *conn) error {
		_, err := c.nc.SubscribeSync(subject)
		return err
	}
}

func jsCall(f func(ctx context.Context, js jetstream.JetStream) error) func(context.Context, *conn) error {
	return func(ctx context.Context, c *conn) error { return f(ctx, c.js) }
}

// TestNATSRefusesCrossTenantAndCrossRole runs every attempt of one identity to act as another
// tenant or another role with raw NATS and JetStream calls, after each role's own path worked;
// the server refuses each with a permissions violation, and the layout is as it was.
func TestNATSRefusesCrossTenantAndCrossRole(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	op := d.connect(t, "operator")
	declare(t, op, d)
	const idA, idB = "20261204t150000-aaaaaaaaaaaa", "20261204t150000-bbbbbbbbbbbb"
	legitimate(t, d, idA, idB)

	attempts := crossAttempts(t, d, idA, idB)
	before := snapshot(t, op)
	refused, said := runAttempts(t, d, attempts)
	if after := snapshot(t, op); !reflect.DeepEqual(before, after) {
		t.Errorf("the refused attempts changed the layout:\nbefore %v\nafter  %v", before, after)
	}
	t.Logf("%d of %d cross-tenant and cross-role attempts refused by the server", refused, len(attempts))
	noSecrets(t, "the refusals", strings.Join(said, "\n"), d.seeds)
}

// crossAttempts are the raw NATS and JetStream attempts of one identity to act as another
// tenant (team-a's on team-b's job idB) or another role (on team-a's job idA).
func crossAttempts(t *testing.T, d *deployment, idA, idB string) []attempt {
	t.Helper()
	n := d.names
	sa, aa, w := "team-a-submitter", "team-a-approver", "worker"
	workerInbox := "_INBOX." + d.userKey(t, w) + ".>"
	return []attempt{
		{"submitter reads another tenant's status", sa, get(statusOf(n, "team-b"), "team-b."+idB)},
		{"submitter watches another tenant's statuses", sa, watch(statusOf(n, "team-b"), "team-b.>")},
		{"submitter lists another tenant's status keys", sa, kvOp(statusOf(n, "team-b"), func(ctx context.Context, kv jetstream.KeyValue) error { _, err := kv.Keys(ctx); return err })},
		{"submitter watches a job id in every tenant (wildcard tenant)", sa, watch(statusOf(n, "team-a"), "*."+idB)},
		{"submitter writes its own job's status (workers only)", sa, put(statusOf(n, "team-a"), "team-a."+idA, `{"state":"succeeded"}`)},
		{"submitter writes succeeded under another tenant's job id", sa, put(statusOf(n, "team-b"), "team-b."+idB, `{"state":"succeeded"}`)},
		{"submitter squats the status of an id another tenant will use", sa, kvOp(statusOf(n, "team-b"), func(ctx context.Context, kv jetstream.KeyValue) error {
			_, err := kv.Create(ctx, "team-b.20261204t160000-cccccccccccc", []byte(`{"state":"succeeded"}`))
			return err
		})},
		{"submitter deletes another tenant's status", sa, kvOp(statusOf(n, "team-b"), func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Delete(ctx, "team-b."+idB) })},
		{"submitter cancels another tenant's job", sa, put(cancelOf(n, "team-b"), "team-b."+idB, `{"by":"mallory"}`)},
		{"submitter cancels another tenant's job in the shared cancel bucket", sa, publish("$KV."+n.CancelBucket+".team-b."+idB, "mallory-"+idB)},
		{"submitter reads another tenant's cancel requests", sa, get(cancelOf(n, "team-b"), "team-b."+idB)},
		{"submitter direct-gets another tenant's request in the shared cancel bucket", sa, request("$JS.API.DIRECT.GET.KV_"+n.CancelBucket+".$KV."+n.CancelBucket+".team-b."+idB, "")},
		{"submitter looks up the shared cancel bucket (every tenant's job ids an older Boxcar's submit asked to cancel)", sa, request("$JS.API.STREAM.INFO.KV_"+n.CancelBucket, "")},
		{"submitter looks up another tenant's cancel bucket (its job ids)", sa, request("$JS.API.STREAM.INFO.KV_"+cancelOf(n, "team-b"), "")},
		{"submitter approves its own job's command (approvers only)", sa, put(approvalsOf(n, "team-a"), "team-a."+idA+".call-1", `{"approved":true}`)},
		{"submitter approves another tenant's command", sa, put(approvalsOf(n, "team-b"), "team-b."+idB+".call-1", `{"approved":true}`)},
		{"approver approves another tenant's command", aa, put(approvalsOf(n, "team-b"), "team-b."+idB+".call-1", `{"approved":true}`)},
		{"approver approves another tenant's command in the shared approvals bucket", aa, put(n.ApprovalsBucket, "team-b."+idB+".call-1", `{"approved":true}`)},
		{"approver reads another tenant's approval requests", aa, get(approvalsOf(n, "team-b"), "team-b."+idB+".call-1")},
		{"approver watches another tenant's approval requests", aa, watch(approvalsOf(n, "team-b"), "team-b.>")},
		{"approver direct-gets another tenant's request in the shared approvals bucket", aa, request("$JS.API.DIRECT.GET.KV_"+n.ApprovalsBucket+".$KV."+n.ApprovalsBucket+".team-b."+idB+".call-1", "")},
		{"submitter looks up the shared approvals bucket (every tenant's job ids an older Boxcar asked about)", sa, request("$JS.API.STREAM.INFO.KV_"+n.ApprovalsBucket, "")},
		{"approver looks up another tenant's approvals bucket (its job ids)", aa, request("$JS.API.STREAM.INFO.KV_"+approvalsOf(n, "team-b"), "")},
		{"approver submits a job (submitters only)", aa, publish(n.JobSubject+".team-a.20261204t160000-dddddddddddd", "team-a.20261204t160000-dddddddddddd")},
		{"approver cancels its tenant's job (submitters only)", aa, put(cancelOf(n, "team-a"), "team-a."+idA, `{"by":"approver"}`)},
		{"approver writes a status", aa, put(statusOf(n, "team-a"), "team-a."+idA, `{"state":"succeeded"}`)},
		{"submitter publishes a job into another tenant", sa, publish(n.JobSubject+".team-b.20261204t160000-eeeeeeeeeeee", "team-b.20261204t160000-eeeeeeeeeeee")},
		{"submitter acks another tenant's job on the worker's ack subject", sa, request("$JS.ACK."+n.JobStream+"_team-b."+n.Consumer+"-team-b.1.1.1.1700000000000000000.0", "+ACK")},
		{"submitter dead-letters an id another tenant will use (pre-emption)", sa, publish(lettersOf(n, "team-b")+".20261204t160000-ffffffffffff", "")},
		{"submitter dead-letters an id another tenant will use in the shared dead-letter stream", sa, publish(n.DeadLetterStream+".team-b.20261204t160000-ffffffffffff", "")},
		{"submitter dead-letters its own next job id (workers only)", sa, publish(lettersOf(n, "team-a")+".20261204t160000-ffffffffffff", "")},
		{"submitter dead-letters its own next job id in the shared dead-letter stream (workers only)", sa, publish(n.DeadLetterStream+".team-a.20261204t160000-ffffffffffff", "")},
		{"submitter reads another tenant's dead letters", sa, jsCall(func(ctx context.Context, js jetstream.JetStream) error {
			s, err := js.Stream(ctx, lettersOf(n, "team-b"))
			if err != nil {
				return err
			}
			_, err = s.GetLastMsgForSubject(ctx, lettersOf(n, "team-b")+"."+idB)
			return err
		})},
		{"submitter reads another tenant's dead letter in the shared stream by its subject", sa, request("$JS.API.DIRECT.GET."+n.DeadLetterStream+"."+n.DeadLetterStream+".team-b."+idB, "")},
		{"submitter looks up the shared dead-letter stream (its info lists every tenant's letters)", sa, request("$JS.API.STREAM.INFO."+n.DeadLetterStream, "")},
		{"submitter reads another tenant's token spending", sa, get(usageOf(n, "team-b"), "team-b.2026-12-04")},
		{"submitter looks up the shared usage bucket (the days every tenant spent on)", sa, request("$JS.API.STREAM.INFO.KV_"+n.UsageBucket, "")},
		{"submitter direct-gets another tenant's day in the shared usage bucket", sa, request("$JS.API.DIRECT.GET.KV_"+n.UsageBucket+".$KV."+n.UsageBucket+".team-b.2026-12-04", "")},
		{"submitter creates a consumer on the job stream (job bodies)", sa, jsCall(func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.CreateConsumer(ctx, n.JobStream+"_team-b", jetstream.ConsumerConfig{FilterSubject: n.JobSubject + ".team-b.*"})
			return err
		})},
		{"submitter fetches from another tenant's worker consumer", sa, request("$JS.API.CONSUMER.MSG.NEXT."+n.JobStream+"_team-b."+n.Consumer+"-team-b", `{"batch":1,"expires":1000000000}`)},
		{"submitter fetches job bodies from its own tenant's worker consumer (workers only)", sa, request("$JS.API.CONSUMER.MSG.NEXT."+n.JobStream+"_team-a."+n.Consumer+"-team-a", `{"batch":1,"expires":1000000000}`)},
		{"submitter reads a job message by sequence", sa, request("$JS.API.STREAM.MSG.GET."+n.JobStream+"_team-a", `{"seq":1}`)},
		{"submitter direct-gets a job message by sequence", sa, request("$JS.API.DIRECT.GET."+n.JobStream+"_team-a", `{"seq":1}`)},
		{"submitter direct-gets another tenant's status with the key in the body", sa, request("$JS.API.DIRECT.GET.KV_"+statusOf(n, "team-a"), `{"last_by_subj":"$KV.`+statusOf(n, "team-a")+`.team-b.`+idB+`"}`)},
		{"submitter subscribes to every inbox", sa, subscribe("_INBOX.>")},
		{"submitter subscribes to the worker's inbox (job bodies it fetches)", sa, subscribe(workerInbox)},
		{"submitter listens to every job publish", sa, subscribe(n.JobSubject + ".>")},
		{"submitter listens to every status write", sa, subscribe("$KV." + statusOf(n, "team-a") + ".>")},
		{"submitter looks up the shared status bucket (every tenant's job ids an older Boxcar wrote)", sa, request("$JS.API.STREAM.INFO.KV_"+n.StatusBucket, "")},
		{"submitter looks up another tenant's status bucket (its job ids)", sa, request("$JS.API.STREAM.INFO.KV_"+statusOf(n, "team-b"), "")},
		{"submitter direct-gets another tenant's status in the shared status bucket", sa, request("$JS.API.DIRECT.GET.KV_"+n.StatusBucket+".$KV."+n.StatusBucket+".team-b."+idB, "")},
		{"approver direct-gets the shared status bucket with the key in the body", aa, request("$JS.API.DIRECT.GET.KV_"+n.StatusBucket, `{"last_by_subj":"$KV.`+n.StatusBucket+`.team-a.`+idA+`"}`)},
		{"submitter reads another tenant's worker consumer", sa, request("$JS.API.CONSUMER.INFO."+n.JobStream+"_team-b."+n.Consumer+"-team-b", "")},
		{"submitter lists the streams", sa, request("$JS.API.STREAM.NAMES", "")},
		{"submitter watches its own statuses (consumers are the workers')", sa, watch(statusOf(n, "team-a"), "team-a.>")},
		{"submitter watches the profiles (consumers are the workers')", sa, watch(n.ProfilesBucket, ">")},
		{"approver watches its own approval requests (consumers are the workers')", aa, watch(approvalsOf(n, "team-a"), "team-a.>")},
		{"submitter's consumer on its own cancel key delivers into another tenant's consumer's next-message subject", sa,
			pushInto(cancelOf(n, "team-a"), "team-a."+idA, "$JS.API.CONSUMER.MSG.NEXT."+n.JobStream+"_team-b."+n.Consumer+"-team-b")},
		{"submitter's consumer on its own cancel key delivers into another tenant's consumer's reset subject", sa,
			pushInto(cancelOf(n, "team-a"), "team-a."+idA, "$JS.API.CONSUMER.RESET."+n.JobStream+"_team-b."+n.Consumer+"-team-b")},
		{"approver's consumer on its own approvals delivers into another tenant's consumer's next-message subject", aa,
			pushInto(approvalsOf(n, "team-a"), "team-a."+idA+".call-1", "$JS.API.CONSUMER.MSG.NEXT."+n.JobStream+"_team-b."+n.Consumer+"-team-b")},
		{"submitter deletes a worker's watch", sa, request("$JS.API.CONSUMER.DELETE.KV_"+cancelOf(n, "team-a")+".somewatch", "")},
		{"submitter lists the watches on the status bucket", sa, request("$JS.API.CONSUMER.NAMES.KV_"+statusOf(n, "team-a"), "")},
		{"submitter creates an unfiltered consumer on the status bucket", sa, request("$JS.API.CONSUMER.CREATE.KV_"+statusOf(n, "team-a"), `{"stream_name":"KV_`+statusOf(n, "team-a")+`","config":{"deliver_subject":"x","ack_policy":"none"}}`)},
		{"submitter purges its status bucket", sa, request("$JS.API.STREAM.PURGE.KV_"+statusOf(n, "team-a"), "")},
		{"submitter deletes its tenant's job stream", sa, request("$JS.API.STREAM.DELETE."+n.JobStream+"_team-a", "")},
		{"submitter looks up another tenant's job stream (its job ids)", sa, request("$JS.API.STREAM.INFO."+n.JobStream+"_team-b", "")},
		{"submitter looks up the shared job stream (the job ids an older Boxcar queued there)", sa, request("$JS.API.STREAM.INFO."+n.JobStream, "")},
		{"submitter direct-gets another tenant's job in the shared job stream", sa, request("$JS.API.DIRECT.GET."+n.JobStream+"."+n.JobSubject+".team-b."+idB, "")},
		{"submitter direct-gets the shared job stream with the subject in the body", sa, request("$JS.API.DIRECT.GET."+n.JobStream, `{"last_by_subj":"`+n.JobSubject+`.team-b.`+idB+`"}`)},
		{"submitter reads another tenant's consumer on the shared job stream", sa, request("$JS.API.CONSUMER.INFO."+n.JobStream+"."+n.Consumer+"-team-b", "")},
		{"worker creates a stream", w, jsCall(func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVIL", Subjects: []string{"evil.>"}})
			return err
		})},
		{"worker creates a bucket", w, jsCall(func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "EVIL"})
			return err
		})},
		{"worker deletes the job stream", w, jsCall(func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteStream(ctx, n.JobStream+"_team-a")
		})},
		{"worker purges a status bucket", w, request("$JS.API.STREAM.PURGE.KV_"+statusOf(n, "team-a"), "")},
		{"worker raises a tenant's max_ack_pending (fair share)", w, jsCall(func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.UpdateConsumer(ctx, n.JobStream+"_team-a", jetstream.ConsumerConfig{Durable: n.Consumer + "-team-a", FilterSubject: n.JobSubject + ".team-a.*", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100000})
			return err
		})},
		{"worker creates a consumer on the job stream", w, jsCall(func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.CreateConsumer(ctx, n.JobStream+"_team-a", jetstream.ConsumerConfig{Durable: "evil", AckPolicy: jetstream.AckExplicitPolicy})
			return err
		})},
		{"worker publishes a job no submitter sent", w, publish(n.JobSubject+".team-a.20261204t160000-999999999999", "team-a.20261204t160000-999999999999")},
	}
}

// runAttempts runs each attempt as its identity and fails the test for one the server did not
// refuse; it returns how many it refused and what the attempts were told.
func runAttempts(t *testing.T, d *deployment, attempts []attempt) (refused int, said []string) {
	t.Helper()
	for _, a := range attempts {
		t.Run(a.name, func(t *testing.T) {
			c := d.connect(t, a.as)
			ok, why := c.refused(t.Context(), c.try(context.Background(), a.try))
			said = append(said, why)
			if !ok {
				t.Errorf("%s was not refused: %s", a.as, why)
				return
			}
			refused++
		})
	}
	return refused, said
}

// legitimate runs each role's own path with raw calls: the worker writes statuses, an
// approval request, a dead letter and spending for both tenants; team-a's submitter publishes
// its job, reads and watches its status, cancels it, reads its dead letter and spending;
// team-a's approver reads the request and answers it; the worker fetches and acks the job.
// None of it is refused.
func legitimate(t *testing.T, d *deployment, idA, idB string) {
	t.Helper()
	n := d.names
	w, sa, aa := d.connect(t, "worker"), d.connect(t, "team-a-submitter"), d.connect(t, "team-a-approver")
	steps := []struct {
		name string
		c    *conn
		do   func(context.Context, *conn) error
	}{
		{"submitter publishes its job", sa, publish(n.JobSubject+".team-a."+idA, "team-a."+idA)},
		{"worker writes statuses", w, func(ctx context.Context, c *conn) error {
			for tn, id := range map[string]string{"team-a": idA, "team-b": idB} {
				if err := put(statusOf(n, tn), tn+"."+id, `{"state":"running"}`)(ctx, c); err != nil {
					return err
				}
			}
			return nil
		}},
		{"worker requests approvals", w, func(ctx context.Context, c *conn) error {
			for tn, id := range map[string]string{"team-a": idA, "team-b": idB} {
				if err := put(approvalsOf(n, tn), tn+"."+id+".call-1", approvalRequest(tn, id))(ctx, c); err != nil {
					return err
				}
			}
			return nil
		}},
		{"worker dead-letters, in each tenant's stream and as an older worker in the shared one, and counts spending", w, func(ctx context.Context, c *conn) error {
			for _, tn := range tenants {
				for _, subject := range []string{lettersOf(n, tn) + ".20261204t140000-000000000000", n.DeadLetterStream + "." + tn + ".20261204t140000-000000000001"} {
					if _, err := c.js.Publish(ctx, subject, []byte(`{}`)); err != nil {
						return err
					}
				}
				for _, b := range []string{usageOf(n, tn), n.UsageBucket} { // this version's, an older worker's
					if err := put(b, tn+".2026-12-04", `{"tokens":10}`)(ctx, c); err != nil {
						return err
					}
				}
			}
			return put(n.ProfilesBucket, "worker-1", `{}`)(ctx, c)
		}},
		{"worker updates a status and counts tokens with the worker's own code", w, func(ctx context.Context, c *conn) error {
			tenantCfg := map[string]config.Tenant{"team-a": {}, "team-b": {}}
			q, err := queue.NewConsumer(ctx, c.nc, config.Config{}.WithDefaults().NATS, tenantCfg, slog.New(slog.DiscardHandler), nil)
			if err != nil {
				return err
			}
			ref := queue.Ref{Tenant: "team-b", ID: idB}
			if _, err := q.UpdateStatus(ctx, ref, func(st *job.Status) { st.State = job.StateRunning }); err != nil {
				return err
			}
			if _, err := q.Status(ctx, ref); err != nil {
				return err
			}
			u, err := queue.OpenUsage(ctx, c.nc, tenants, true)
			if err != nil {
				return err
			}
			_, err = u.Add(ctx, "team-b", time.Now(), 5, 0)
			return err
		}},
		{"submitter reads its status", sa, get(statusOf(n, "team-a"), "team-a."+idA)},
		{"submitter lists and watches its statuses (submit list, watch)", sa, client("team-a", func(ctx context.Context, q *queue.Client) error {
			return listsAndWatches(ctx, q, idA)
		})},
		{"submitter asks for a job no worker wrote a status for, in its bucket and by its key in the shared one", sa, client("team-a", func(ctx context.Context, q *queue.Client) error {
			if _, err := q.Status(ctx, "20261204t160000-aaaaaaaaaaa0"); !errors.Is(err, queue.ErrUnknownJob) {
				return fmt.Errorf("status of a job no one wrote: %w, want unknown", err)
			}
			return nil
		})},
		{"submitter cancels its job", sa, put(cancelOf(n, "team-a"), "team-a."+idA, `{"by":"ann"}`)},
		{"submitter asks it in the shared cancel bucket too, where older workers watch", sa, ask("$KV."+n.CancelBucket+".team-a."+idA, `{"by":"ann"}`)},
		{"submitter reads it there by its key", sa, ask("$JS.API.DIRECT.GET.KV_"+n.CancelBucket+".$KV."+n.CancelBucket+".team-a."+idA, "")},
		{"submitter reads its approval requests", sa, get(approvalsOf(n, "team-a"), "team-a."+idA+".call-1")},
		{"submitter reads its dead letters, in its stream and by their subjects in the shared one", sa, func(ctx context.Context, c *conn) error {
			for _, id := range []string{"20261204t140000-000000000000", "20261204t140000-000000000001"} {
				if _, err := queue.DeadLetterOf(ctx, c.nc, config.Config{}.WithDefaults().NATS, queue.Ref{Tenant: "team-a", ID: id}); err != nil {
					return err
				}
			}
			return nil
		}},
		{"submitter reads its spending, in its bucket and by its key in the shared one", sa, func(ctx context.Context, c *conn) error {
			u, err := queue.OpenUsage(ctx, c.nc, []string{"team-a"}, false)
			if err != nil {
				return err
			}
			d, err := u.Day(ctx, "team-a", time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
			if err == nil && d.Tokens != 20 {
				err = fmt.Errorf("team-a's day: %d tokens, want its 10 and an older worker's 10", d.Tokens)
			}
			return err
		}},
		{"submitter reads the profiles (submit profiles)", sa, client("team-a", func(ctx context.Context, q *queue.Client) error {
			_, err := q.LiveProfiles(ctx)
			return err
		})},
		{"submitter reads its worker consumer", sa, ask("$JS.API.CONSUMER.INFO."+n.JobStream+"_team-a."+n.Consumer+"-team-a", "")},
		{"approver lists the request (submit approvals)", aa, client("team-a", func(ctx context.Context, q *queue.Client) error {
			pending, skipped, err := q.PendingApprovals(ctx, idA)
			if err == nil && (len(pending) != 1 || len(skipped) != 0) {
				err = fmt.Errorf("approvals of %s: %d pending, skipped %v; want the one request", idA, len(pending), skipped)
			}
			return err
		})},
		{"approver lists and watches its statuses", aa, client("team-a", func(ctx context.Context, q *queue.Client) error {
			return listsAndWatches(ctx, q, idA)
		})},
		{"approver answers it", aa, put(approvalsOf(n, "team-a"), "team-a."+idA+".call-1", `{"approved":true}`)},
		{"worker asks in the shared approvals bucket (an older worker of an upgrade)", w, put(n.ApprovalsBucket, "team-a."+idA+".call-1", approvalRequest("team-a", idA))},
		{"approver reads that request by its key", aa, ask("$JS.API.DIRECT.GET.KV_"+n.ApprovalsBucket+".$KV."+n.ApprovalsBucket+".team-a."+idA+".call-1", "")},
		{"approver answers it there", aa, publish("$KV."+n.ApprovalsBucket+".team-a."+idA+".call-1", "answer-"+idA)},
		{"approver reads its status", aa, get(statusOf(n, "team-a"), "team-a."+idA)},
		{"worker watches a tenant's cancels", w, watch(cancelOf(n, "team-a"), ">")},
		{"worker watches the shared bucket's cancels (an older worker of an upgrade)", w, watch(n.CancelBucket, ">")},
		{"worker fetches and acks the job", w, func(ctx context.Context, c *conn) error {
			cons, err := c.js.Consumer(ctx, n.JobStream+"_team-a", n.Consumer+"-team-a")
			if err != nil {
				return err
			}
			m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
			if err != nil {
				return fmt.Errorf("next: %w", err)
			}
			if err := m.InProgress(); err != nil {
				return err
			}
			return m.DoubleAck(ctx)
		}},
	}
	for _, s := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := s.do(ctx, s.c)
		cancel()
		if err != nil {
			s.c.mu.Lock()
			t.Fatalf("%s: %v (refused: %v)", s.name, err, s.c.violations)
		}
	}
	for name, c := range map[string]*conn{"worker": w, "submitter": sa, "approver": aa} {
		if err := c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		for _, v := range c.violations {
			// An approver's client asks for the job stream, to tell a queued job, and does
			// without it when refused (queue.NewClient).
			if name != "approver" || !strings.Contains(v, `"$JS.API.STREAM.INFO.`+n.JobStream+`_team-a"`) {
				t.Errorf("the %s's own path was refused: %v", name, v)
			}
		}
		c.mu.Unlock()
	}
}

// client runs f with a queue.Client of tenant on the connection: the reads and writes
// `submit` makes.
func client(tenant string, f func(ctx context.Context, q *queue.Client) error) func(context.Context, *conn) error {
	return func(ctx context.Context, c *conn) error {
		q, err := queue.NewClient(ctx, c.nc, config.Config{}.WithDefaults().NATS, tenant)
		if err != nil {
			return err
		}
		return f(ctx, q)
	}
}

// listsAndWatches lists the client's jobs, which must hold id, and watches id until its first
// status: no consumer is created for either.
func listsAndWatches(ctx context.Context, q *queue.Client, id string) error {
	list, err := q.ListStatuses(ctx, nil)
	if err != nil {
		return err
	}
	if len(list) != 1 || list[0].ID != id {
		return fmt.Errorf("list = %v, want %s alone", list, id)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates, err := q.WatchStatus(wctx, id)
	if err != nil {
		return err
	}
	if st, ok := <-updates; !ok || st.ID != id {
		return fmt.Errorf("watch of %s ended without its status (%v)", id, ctx.Err())
	}
	return nil
}

// approvalRequest is what a worker asks under the approvals key of tenant's job id, call-1.
func approvalRequest(tenant, id string) string {
	return fmt.Sprintf(`{"tenant":%q,"job_id":%q,"call_id":"call-1","argv":["rm","-rf","x"],"requested_at":"2026-12-04T15:00:00Z","expires_at":"2099-01-01T00:00:00Z"}`, tenant, id)
}

// pushInto is creating, with the consumer-create subject of the identity's own key, a push
// consumer on the bucket's stream whose deliver subject is target: the server checks the
// filter against the subject but the deliver subject against no permission (nats-server
// issue #8274), so only a refused create keeps a tenant from delivering into target.
func pushInto(bucket, key, target string) func(context.Context, *conn) error {
	stream, filter := "KV_"+bucket, "$KV."+bucket+"."+key
	// A name of its own per target: were one let through, the next would not fail on the name.
	name := fmt.Sprintf("intruder-%08x", crc32.ChecksumIEEE([]byte(target)))
	body := fmt.Sprintf(`{"stream_name":%q,"config":{"name":%q,"filter_subject":%q,"deliver_subject":%q,"ack_policy":"explicit","deliver_policy":"last_per_subject"}}`,
		stream, name, filter, target)
	return request("$JS.API.CONSUMER.CREATE."+stream+"."+name+"."+filter, body)
}
