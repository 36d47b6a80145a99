package queue_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/natsconfig"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/natsauthtest"
)

// tenancyServer starts a real nats-server with `worker nats-config`'s permissions for team-a
// and team-b and declares the layout as the operator; it returns a connector by identity name
// ("worker", "team-a-approver", …), so that a test writes only what that login may.
func tenancyServer(t *testing.T) (config.NATS, func(name string) *nats.Conn) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Config{}.WithDefaults().NATS
	res, err := natsconfig.Generate(natsconfig.Options{
		Dir: filepath.Join(dir, "nats"), Names: natsconfig.NamesOf(cfg), Tenants: []string{"team-a", "team-b"},
		Listen: "127.0.0.1:-1", StoreDir: filepath.Join(dir, "js"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ns := natsauthtest.StartFromConfig(t, res.ServerConfig)
	conn := func(name string) *nats.Conn {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		nc, err := queue.Connect(ctx, queue.ConnOptions{URL: ns.ClientURL(), Name: "test-" + name, CredsFile: res.Creds[name]})
		if err != nil {
			t.Fatalf("connect as %s: %v", name, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	tenants := map[string]config.Tenant{"team-a": {Profiles: []string{"p"}}, "team-b": {Profiles: []string{"p"}}}
	admin, err := queue.NewAdmin(conn("operator"), cfg, tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	return cfg, conn
}

// approvalsParties are the three sides of team-a's approvals on a tenancy server: the worker
// that asks, the approver's client that lists and answers, and raw, which writes any body
// under any of team-a's keys with the approver's login, as anyone holding it can.
type approvalsParties struct {
	worker   *queue.Consumer
	approver *queue.Client
	raw      func(t *testing.T, key string, a queue.Approval)
}

func newApprovalsParties(t *testing.T) approvalsParties {
	t.Helper()
	cfg, conn := tenancyServer(t)
	ctx := t.Context()
	w, err := queue.NewConsumer(ctx, conn("worker"), cfg, map[string]config.Tenant{"team-a": {}, "team-b": {}}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	approver, err := queue.NewClient(ctx, conn("team-a-approver"), cfg, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(conn("team-a-approver"))
	if err != nil {
		t.Fatal(err)
	}
	raw := func(t *testing.T, key string, a queue.Approval) {
		t.Helper()
		data, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(t.Context(), "$KV."+queue.ApprovalsBucket(cfg, "team-a")+"."+key, data); err != nil {
			t.Fatalf("the approver's login writes %s: %v", key, err)
		}
	}
	return approvalsParties{worker: w, approver: approver, raw: raw}
}

// asked is a pending request of team-a's job.
func asked(jobID, callID string, argv []string) queue.Approval {
	now := time.Now().UTC()
	return queue.Approval{Tenant: "team-a", JobID: jobID, CallID: callID, Argv: argv, Attempt: 1, RequestedAt: now, ExpiresAt: now.Add(time.Minute)}
}

// TestApprovalListingShowsWhatIsSigned: a body written under a key of its own that names a
// real request (its job and call, a harmless command) is not listed as that request; the
// listing says it skipped it, and the answer to the request, bound to the revision listed,
// signs the command listed for it.
func TestApprovalListingShowsWhatIsSigned(t *testing.T) {
	t.Parallel()
	p := newApprovalsParties(t)
	ctx := t.Context()
	jobID, callID := job.NewID(), "call_real"
	danger := []string{"rm", "-rf", "/work"}
	if _, err := p.worker.RequestApproval(ctx, asked(jobID, callID, danger)); err != nil {
		t.Fatal(err)
	}
	decoy := asked(jobID, callID, []string{"ls"})
	decoy.RequestedAt = decoy.RequestedAt.Add(-time.Second) // listed first, were it listed
	p.raw(t, "team-a."+jobID+".decoy", decoy)

	pending, skipped, err := p.approver.PendingApprovals(ctx, jobID)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1 || pending[0].CallID != callID || !slices.Equal(pending[0].Argv, danger) {
		t.Fatalf("pending = %+v; want call %s alone, with %q", pending, callID, danger)
	}
	if len(skipped) != 1 || skipped[0].Key != "team-a."+jobID+".decoy" || !strings.Contains(skipped[0].Error, queue.ErrMisfiledApproval.Error()) {
		t.Errorf("skipped = %+v; want the decoy's key, misfiled", skipped)
	}
	signed, err := p.approver.DecideApproval(ctx, jobID, callID, pending[0].Revision, job.DecisionApproved, "alice", "", nil)
	if err != nil || !slices.Equal(signed.Argv, pending[0].Argv) || signed.Revision <= pending[0].Revision {
		t.Errorf("answer = %+v, %v; want the listed command %q answered", signed, err, pending[0].Argv)
	}
}

// TestMisfiledApprovalsAreRefused: an entry whose body names another request than its key is
// refused by every reader of the bucket: the listing skips it and says so, reading it to
// answer and answering it fail with ErrMisfiledApproval, the worker's watch does not take it
// for an answer, and the worker does not take it for an earlier answer when it asks.
func TestMisfiledApprovalsAreRefused(t *testing.T) {
	t.Parallel()
	p := newApprovalsParties(t)
	digest := func(callID string) string {
		sum := sha256.Sum256([]byte(callID))
		return "=" + hex.EncodeToString(sum[:16])
	}
	tests := []struct {
		name string
		call string // the call id of the key; the key is team-a.<job>.<call's token>
		// body is what is written under the key, for the key's job id.
		body func(jobID string) queue.Approval
	}{
		{name: "another call of the job", call: "call_1", body: func(id string) queue.Approval { return asked(id, "call_2", []string{"ls"}) }},
		{name: "another job", call: "call_1", body: func(string) queue.Approval { return asked(job.NewID(), "call_1", []string{"ls"}) }},
		{name: "another tenant", call: "call_1", body: func(id string) queue.Approval {
			a := asked(id, "call_1", []string{"ls"})
			a.Tenant = "team-b"
			return a
		}},
		{name: "no tenant", call: "call_1", body: func(id string) queue.Approval {
			a := asked(id, "call_1", []string{"ls"})
			a.Tenant = ""
			return a
		}},
		{name: "a call id of another digest", call: "call:9f/ä b?*>", body: func(id string) queue.Approval { return asked(id, "call:other", []string{"ls"}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			jobID := job.NewID()
			token := tt.call
			if strings.ContainsAny(token, ":/ ?*>") {
				token = digest(tt.call)
			}
			key := "team-a." + jobID + "." + token
			body := tt.body(jobID)
			body.Decision, body.DecidedBy, body.DecidedAt = job.DecisionApproved, "alice", time.Now().UTC()
			p.raw(t, key, body)

			pending, skipped, err := p.approver.PendingApprovals(ctx, jobID)
			if err != nil || len(pending) != 0 || len(skipped) != 1 || skipped[0].Key != key {
				t.Errorf("PendingApprovals = %+v, skipped %+v, %v; want nothing listed and %s skipped", pending, skipped, err, key)
			}
			if _, err := p.approver.Approval(ctx, jobID, tt.call); !errors.Is(err, queue.ErrMisfiledApproval) {
				t.Errorf("Approval = %v, want ErrMisfiledApproval", err)
			}
			if _, err := p.approver.DecideApproval(ctx, jobID, tt.call, 0, job.DecisionApproved, "alice", "", nil); !errors.Is(err, queue.ErrMisfiledApproval) {
				t.Errorf("DecideApproval = %v, want ErrMisfiledApproval", err)
			}
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			ref := queue.Ref{Tenant: "team-a", ID: jobID}
			if a, err := p.worker.WaitApproval(wctx, ref, tt.call); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("WaitApproval = %+v, %v; want no answer (DeadlineExceeded)", a, err)
			}
			same := asked(jobID, tt.call, body.Argv)
			if a, err := p.worker.RequestApproval(ctx, same); !errors.Is(err, queue.ErrMisfiledApproval) {
				t.Errorf("RequestApproval = %+v, %v; want ErrMisfiledApproval", a, err)
			}
		})
	}
}

// TestDecideApprovalBoundToRevision: an answer given with the revision a person was shown is
// refused once the key holds another request (here the worker asking another command under
// the same call), and names what to do; with the current revision it is recorded.
func TestDecideApprovalBoundToRevision(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	id := newJob(t).ID
	shown, err := b.w.RequestApproval(ctx, pendingApproval(id, "call_1", []string{"ls"}, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	now, err := b.w.RequestApproval(ctx, pendingApproval(id, "call_1", []string{"rm", "-rf", "/"}, time.Minute))
	if err != nil || now.Revision == shown.Revision {
		t.Fatalf("asking another command = %+v, %v; want a new revision", now, err)
	}
	_, err = b.c.DecideApproval(ctx, id, "call_1", shown.Revision, job.DecisionApproved, "alice", "", nil)
	if !errors.Is(err, queue.ErrApprovalChanged) || !strings.Contains(err.Error(), "submit approvals "+id) {
		t.Errorf("answer to the revision shown = %v; want ErrApprovalChanged saying to list again", err)
	}
	if read, err := b.c.Approval(ctx, id, "call_1"); err != nil || read.Revision != now.Revision || !slices.Equal(read.Argv, now.Argv) {
		t.Errorf("Approval = %+v, %v; want the request as it is now", read, err)
	}
	got, err := b.c.DecideApproval(ctx, id, "call_1", now.Revision, job.DecisionDenied, "alice", "", nil)
	if err != nil || got.Decision != job.DecisionDenied || !slices.Equal(got.Argv, now.Argv) {
		t.Errorf("answer to the current revision = %+v, %v", got, err)
	}
}

// TestShortQuoteKeepsWholeCharacters: what a misfiled approval claims is quoted in the error
// cut to whole characters; it was cut at its 80th byte, inside a character, which the quote
// then showed as \x escapes.
func TestShortQuoteKeepsWholeCharacters(t *testing.T) {
	t.Parallel()
	got := queue.ShortQuote(strings.Repeat("t", 79) + strings.Repeat("€", 5))
	if want := strconv.Quote(strings.Repeat("t", 79) + "…"); got != want {
		t.Errorf("ShortQuote = %s, want %s", got, want)
	}
}
