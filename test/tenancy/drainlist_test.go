//go:build integration

package tenancy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/submitcmd"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestListSaysDrainingJobsAreNotListed: a tenant's jobs an older Boxcar queued in the shared
// job stream, still there while the upgrade drains it, cannot be listed with the tenant's
// permissions (the stream's info lists every tenant's jobs; a direct get needs the job's
// subject, and a wildcard one gives the last job only): `submit list` of that tenant says how
// many wait there unlisted and how to see one, as text and as JSON, and another tenant's says
// nothing of them. Before, list printed "no jobs match" and said nothing of them.
func TestListSaysDrainingJobsAreNotListed(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	op := d.connect(t, "operator")
	n := d.names
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// The shared stream and the tenants' consumers on it, as a Boxcar before a stream per
	// tenant had them, holding two of team-a's jobs.
	shared, err := op.js.CreateStream(ctx, jetstream.StreamConfig{Name: n.JobStream, Subjects: []string{n.JobSubject + ".team-a.*", n.JobSubject + ".team-b.*"},
		Retention: jetstream.WorkQueuePolicy, MaxMsgsPerSubject: 1, DiscardNewPerSubject: true, Discard: jetstream.DiscardNew})
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range tenants {
		if _, err := shared.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: n.Consumer + "-" + tn, FilterSubject: n.JobSubject + "." + tn + ".*", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	old := d.connect(t, "team-a-submitter") // as an older submit published them
	for _, id := range []string{job.NewID(), job.NewID()} {
		data, err := job.Job{Version: job.Version, ID: id, Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := old.js.Publish(ctx, n.JobSubject+".team-a."+id, data, jetstream.WithExpectStream(n.JobStream)); err != nil {
			t.Fatal(err)
		}
	}
	setUp(t, d)

	list := func(tenant string, args ...string) (string, string, error) {
		env := harness.Env{"BOXCAR_HOME": t.TempDir(), "NATS_URL": d.url, "NATS_CREDS": d.creds[tenant+"-submitter"], "NATS_CA": d.certs.CA,
			"NATS_CERT": d.certs.ClientCert, "NATS_KEY": d.certs.ClientKey, "BOXCAR_TENANT": tenant}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		var stdout, stderr bytes.Buffer
		err := submitcmd.Run(ctx, append([]string{"list"}, args...), env.Getenv, &stdout, &stderr)
		return stdout.String(), stderr.String(), err
	}
	const note = "2 jobs queued by an older Boxcar wait in the shared job stream " + "BOXCAR_JOBS" + " and are not listed"
	harness.Wait(t, "team-a's list to say its 2 jobs waiting in the shared stream are not listed", func() (bool, error) {
		stdout, stderr, err := list("team-a")
		return err == nil && strings.Contains(stderr, note) && strings.Contains(stderr, "submit status ID"),
			fmt.Errorf("list: %v\nstdout %s\nstderr %s", err, stdout, stderr)
	}, harness.Within(20*time.Second))
	stdout, stderr, err := list("team-a", "--output", "json")
	var page struct {
		Jobs           []any `json:"jobs"`
		UnlistedShared int   `json:"unlisted_shared"`
	}
	if err != nil || json.Unmarshal([]byte(stdout), &page) != nil || page.UnlistedShared != 2 {
		t.Errorf("team-a's list --output json: %v, %+v\n%s%s; want unlisted_shared 2", err, page, stdout, stderr)
	}
	if _, stderr, err := list("team-a", "--state", "running"); err != nil || strings.Contains(stderr, "shared job stream") {
		t.Errorf("team-a's list of running jobs: %v\n%s; want nothing said of queued ones", err, stderr)
	}
	if stdout, stderr, err := list("team-b"); err != nil || strings.Contains(stdout+stderr, "shared job stream") {
		t.Errorf("team-b's list: %v\n%s%s; want nothing said of team-a's jobs", err, stdout, stderr)
	}
}
