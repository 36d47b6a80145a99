//go:build integration

package tenancy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestTenantCannotDeliverIntoAnotherTenantsConsumer: the server checks no consumer's deliver
// subject (nats-server issue #8274) and delivers into any subject a subscription holds by its
// exact name, as every pull consumer does its next-message and reset subjects. A tenant's
// identity allowed a consumer even on its own keys could so hand another tenant's jobs to
// nobody (a pull request as its key's value, delivered into the consumer's next-message
// subject) or have a running job delivered again (into its reset subject). Tenants create no
// consumer: the server refuses each try, and team-b's jobs reach the worker once each, the one
// it runs not again.
func TestTenantCannotDeliverIntoAnotherTenantsConsumer(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	n := d.names
	declare(t, d.connect(t, "operator"), d)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const idA, running, later = "20261204t150000-aaaaaaaaaaaa", "20261204t150000-b00000000001", "20261204t150000-b00000000002"
	b, w := d.connect(t, "team-b-submitter"), d.connect(t, "worker")
	cons, err := w.js.Consumer(ctx, n.JobStream+"_team-b", n.Consumer+"-team-b")
	if err != nil {
		t.Fatal(err)
	}
	// team-b's job a worker runs while team-a's identities try.
	publishJob(ctx, t, b, n.JobSubject+".team-b."+running)
	first := fetch(t, cons, running)

	// Each key the consumers would deliver holds a pull request: written with the
	// identity's own rights, which it keeps.
	pull := `{"batch":100,"expires":50000000000}`
	sa, aa := d.connect(t, "team-a-submitter"), d.connect(t, "team-a-approver")
	if err := put(cancelOf(n, "team-a"), "team-a."+idA, pull)(ctx, sa); err != nil {
		t.Fatalf("team-a's submitter writes its own cancel key: %v", err)
	}
	if err := put(approvalsOf(n, "team-a"), "team-a."+idA+".call-1", pull)(ctx, aa); err != nil {
		t.Fatalf("team-a's approver writes its own answer: %v", err)
	}
	next := "$JS.API.CONSUMER.MSG.NEXT." + n.JobStream + "_team-b." + n.Consumer + "-team-b"
	reset := "$JS.API.CONSUMER.RESET." + n.JobStream + "_team-b." + n.Consumer + "-team-b"
	refused, _ := runAttempts(t, d, []attempt{
		{"submitter delivers a pull request into team-b's consumer", "team-a-submitter", pushInto(cancelOf(n, "team-a"), "team-a."+idA, next)},
		{"submitter resets team-b's consumer", "team-a-submitter", pushInto(cancelOf(n, "team-a"), "team-a."+idA, reset)},
		{"approver delivers a pull request into team-b's consumer", "team-a-approver", pushInto(approvalsOf(n, "team-a"), "team-a."+idA+".call-1", next)},
		{"approver resets team-b's consumer", "team-a-approver", pushInto(approvalsOf(n, "team-a"), "team-a."+idA+".call-1", reset)},
	})
	t.Logf("%d of 4 consumers delivering into team-b's consumer refused", refused)

	// A job team-b publishes now reaches the worker, at its first delivery: no pull request
	// of team-a's took it. The job the worker runs is not delivered again: nothing reset.
	publishJob(ctx, t, b, n.JobSubject+".team-b."+later)
	second := fetch(t, cons, later)
	if m, err := cons.Next(jetstream.FetchMaxWait(3 * time.Second)); err == nil {
		meta, _ := m.Metadata()
		t.Errorf("team-b's consumer delivered %s again (delivery %d) while the worker still runs it", m.Subject(), meta.NumDelivered)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer != 2 || info.NumAckPending != 2 || info.NumRedelivered != 0 {
		t.Errorf("team-b's consumer delivered %d, %d awaiting an ack, %d redelivered; want the worker's 2 only",
			info.Delivered.Consumer, info.NumAckPending, info.NumRedelivered)
	}
	for _, m := range []jetstream.Msg{first, second} {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// publishJob publishes a job on subject as the identity of c.
func publishJob(ctx context.Context, t *testing.T, c *conn, subject string) {
	t.Helper()
	if _, err := c.js.Publish(ctx, subject, []byte(`{"id":"x","profile":"p","task":"t"}`)); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// fetch is the worker fetching the next job of cons, which must be id at its first delivery.
func fetch(t *testing.T, cons jetstream.Consumer, id string) jetstream.Msg {
	t.Helper()
	m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("the worker's fetch of %s: %v (taken by someone else?)", id, err)
	}
	meta, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(m.Subject(), "."+id) || meta.NumDelivered != 1 {
		t.Fatalf("the worker fetched %s at delivery %d; want %s at its first", m.Subject(), meta.NumDelivered, id)
	}
	return m
}
