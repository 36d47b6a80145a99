package workercmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/connflags"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// setupCmd is `worker setup --config FILE`: the operator's step. It declares what workers and
// submitters bind to (the job and dead-letter streams, one consumer per tenant, the status,
// cancel and approvals buckets) from the same config the workers read, with an identity that
// may create them. Workers whose identity may not, bind; a worker with the rights does the same
// at every start.
func setupCmd(getenv func(string) string, stdout, stderr io.Writer) *cobra.Command {
	var (
		path string
		auth connflags.NATS
	)
	c := &cobra.Command{
		Use:   "setup --config FILE",
		Short: "declare the job stream, the tenants' consumers and the buckets (an operator identity)",
		Long: `Declares, from the worker config FILE, what workers and submitters use: the job stream, the
dead-letter stream, one durable consumer per tenant (boxcar-workers-TENANT, max_ack_pending = the
tenant's max_concurrent) and the status, cancel and approvals buckets. Run it with an identity
allowed to create them (the operator's); workers may then run with identities that only bind. It
is safe to run again: it updates what changed in the config and keeps stream limits an operator
edited.`,
		Args: cli.Args(0, 0, "setup: takes no arguments; give the config with --config FILE"),
		RunE: func(c *cobra.Command, _ []string) error {
			if path == "" {
				return fmt.Errorf("setup: --config FILE is required (the worker config: nats and tenants)")
			}
			return runSetup(c.Context(), setupBudget, path, auth, getenv, stdout, stderr)
		},
	}
	c.Flags().StringVar(&path, "config", "", "worker config `FILE` (YAML): its nats and tenants sections say what to declare")
	auth.Bind(c.Flags())
	return c
}

// setupBudget is how long setup waits for NATS to answer its declarations.
const setupBudget = time.Minute

// setupHints picks what a failed declaration tells the operator to do, by what failed: a
// permission refusal shows on the connection, not in a reply (Declare ends at it, queue's
// ErrRefused, or at a look-up's deadline); a deadline without one is a JetStream that answered
// nobody, not a missing right. The first row that matches speaks.
var setupHints = []struct {
	matches func(nc *nats.Conn, err error) bool
	hint    func(budget time.Duration) string
}{
	{func(nc *nats.Conn, _ error) bool { return queue.Refused(nc) },
		func(time.Duration) string {
			return "may this identity create streams, consumers and buckets? NATS refused its requests on $JS.API: run setup as the operator"
		}},
	{func(_ *nats.Conn, err error) bool { return errors.Is(err, context.DeadlineExceeded) },
		func(budget time.Duration) string {
			return fmt.Sprintf("NATS answered none of setup's requests within %s: is JetStream up and its meta leader elected (`nats server report jetstream`)? run setup again", budget)
		}},
	{func(*nats.Conn, error) bool { return true },
		func(time.Duration) string {
			return "may this identity create streams, consumers and buckets? run setup as the operator"
		}},
}

// setupHint is the hint of the first row of setupHints that matches err.
func setupHint(nc *nats.Conn, err error, budget time.Duration) string {
	for _, row := range setupHints {
		if row.matches(nc, err) {
			return row.hint(budget)
		}
	}
	return ""
}

// runSetup connects with the flags' identity and declares everything the config says, waiting
// at most budget for NATS to answer the declarations.
func runSetup(ctx context.Context, budget time.Duration, path string, auth connflags.NATS, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, _, err := config.LoadSource(path)
	if err != nil {
		return err
	}
	if err := applyEnvURLs(&cfg, getenv); err != nil {
		return err
	}
	opts, err := auth.Options(cfg.NATS.URL, "boxcar-setup", getenv)
	if err != nil {
		return err
	}
	opts.Unreachable = "is NATS running there? setup connects to the config's nats.url, or NATS_URL when set, with the login of its --nats-* flags"
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nc, err := queue.Connect(cctx, opts)
	if err != nil {
		return err
	}
	defer nc.Close()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	admin, err := queue.NewAdmin(nc, cfg.NATS, cfg.Tenants, log)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	if err := admin.DeclareUnlessRefused(dctx); err != nil {
		return fmt.Errorf("setup: %w (%s)", err, setupHint(nc, err, budget))
	}
	tenants := cfg.TenantsOrDefault()
	for _, name := range slices.Sorted(maps.Keys(tenants)) {
		if _, err := fmt.Fprintf(stdout, "tenant %s: stream %s (%s), consumer %s-%s, max_concurrent %d, status bucket %s, approvals bucket %s, cancel bucket %s, dead letters %s, usage bucket %s\n",
			name, queue.JobStream(cfg.NATS, name), queueBound(cfg, name, tenants[name]), cfg.NATS.Consumer, name, tenants[name].MaxConcurrent,
			queue.StatusBucket(cfg.NATS, name), queue.ApprovalsBucket(cfg.NATS, name), queue.CancelBucketOf(name), queue.DeadLetterStream(cfg.NATS, name), queue.UsageBucketOf(name)); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(stdout, "declared a job stream, a status bucket, an approvals bucket, a cancel bucket, a dead-letter stream and a usage bucket per tenant, the shared stream %s (retired tenants; jobs an older Boxcar queued, until settled) and the shared dead-letter stream %s (tenants without a dead-letter stream of their own; letters an older Boxcar wrote) on %s\n",
		cfg.NATS.Stream, cfg.NATS.DeadLetterStream, queue.RedactURL(cfg.NATS.URL))
	return err
}

// queueBound says how much one tenant's queue may hold and the setting each bound comes from
// (config.QueueBounds): setup prints what it applies, check-config what setup would.
func queueBound(cfg config.Config, tenant string, t config.Tenant) string {
	parts := []string{}
	for _, b := range cfg.QueueBounds(tenant, t) {
		if b.Value <= 0 {
			parts = append(parts, fmt.Sprintf("unbounded %s (%s)", b.Unit, b.Setting))
			continue
		}
		parts = append(parts, fmt.Sprintf("at most %d %s (%s)", b.Value, b.Unit, b.Setting))
	}
	return "queue " + strings.Join(parts, ", ")
}
