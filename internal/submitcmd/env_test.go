package submitcmd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
)

// testEnv is a real embedded nats-server set up as a worker sets it up, a file store and a
// BOXCAR_HOME, which is all submit talks to.
type testEnv struct {
	ns       *server.Server
	natsDir  string // JetStream's files, kept across restart
	natsURL  string
	q        *queue.Consumer // what a worker writes
	c        *queue.Client   // what submit reads, as tenant default
	home     string
	storeDir string
	st       store.Store
	js       jetstream.JetStream
}

func newTestEnv(t testing.TB) *testEnv { return newTestEnvSync(t, true) }

// newTestEnvSync starts the server with fsync on every write (tests that restart it) or with
// nats-server's default interval (benchmarks, as deployed).
func newTestEnvSync(t testing.TB, syncAlways bool) *testEnv {
	t.Helper()
	natsDir := t.TempDir()
	ns := queuetest.Start(t, queue.EmbeddedOptions{StoreDir: natsDir, SyncAlways: syncAlways})
	te := &testEnv{ns: ns, natsDir: natsDir, natsURL: ns.ClientURL(), home: t.TempDir()}
	te.q = te.setUpQueue(t)
	te.storeDir = filepath.Join(te.home, "store")
	st, err := store.Open(t.Context(), "file://"+te.storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The default tenant's objects, where a worker writes them and submit looks.
	te.st = store.ForTenant(st, job.DefaultTenant)
	t.Cleanup(func() { st.Close() })
	// The approver key an embedded worker would keep, which submit approve signs with.
	if _, _, _, err := provenance.LoadOrCreateKeyPair(filepath.Join(te.home, "keys", "approver")); err != nil {
		t.Fatal(err)
	}
	return te
}

// setUpQueue creates the streams and buckets, as a worker does at start.
func (te *testEnv) setUpQueue(t testing.TB) *queue.Consumer {
	t.Helper()
	nc, err := queue.Connect(t.Context(), queue.ConnOptions{URL: te.natsURL, Name: "submitcmd-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if te.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{}.WithDefaults().NATS
	cfg.URL = te.natsURL
	q, err := queue.Open(t.Context(), nc, cfg, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if te.c, err = queue.NewClient(t.Context(), nc, cfg, "default"); err != nil {
		t.Fatal(err)
	}
	return q
}

// ref names a job of tenant default, as a worker knows it.
func ref(id string) queue.Ref { return queue.Ref{Tenant: "default", ID: id} }

// restart stops nats-server (unless it is stopped) and starts it again on the same port and files, as an operator's
// restart does; clients reconnect by themselves.
func (te *testEnv) restart(t *testing.T) {
	t.Helper()
	u, err := url.Parse(te.natsURL) // the server may be stopped already: its address is gone
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	te.ns.Shutdown()
	te.ns.WaitForShutdown()
	te.ns = queuetest.Start(t, queue.EmbeddedOptions{Port: port, StoreDir: te.natsDir, SyncAlways: true})
}

// waitFor is harness.Wait for a condition with nothing to report but whether it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	harness.Wait(t, what, func() (bool, error) { return cond(), nil })
}

func (te *testEnv) getenv(k string) string {
	return map[string]string{"NATS_URL": te.natsURL, "BOXCAR_HOME": te.home}[k]
}

// submit runs the command against te and returns stdout, stderr and the error.
func (te *testEnv) submit(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stderr bytes.Buffer
	stdout, err := te.submitStderr(t, &stderr, args...)
	return stdout, stderr.String(), err
}

// submitStderr runs a command as submit does, its stderr written to stderr as it goes: a test
// reads a harness.LogBuffer to know how far the command got while it runs.
func (te *testEnv) submitStderr(t *testing.T, stderr io.Writer, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	err := Run(ctx, args, te.getenv, &stdout, stderr)
	return stdout.String(), err
}

// runAs runs a command on the test's store and NATS as a user whose BOXCAR_HOME is home (its
// keys the embedded worker's when home is te.home, none in an empty folder).
func (te *testEnv) runAs(t *testing.T, home string, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := Run(t.Context(), append(args, "--store", "file://"+te.storeDir), func(k string) string {
		return map[string]string{"BOXCAR_HOME": home, "NATS_URL": te.natsURL}[k]
	}, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// noEnv runs a command that must not need NATS or a store.
func noEnv(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	home := t.TempDir()
	err := Run(t.Context(), args, func(k string) string {
		// Nothing listens on port 1: a command that connects fails, and says so.
		return map[string]string{"BOXCAR_HOME": home, "NATS_URL": "nats://127.0.0.1:1"}[k]
	}, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// exitCode is the process exit code cmd/submit gives err.
func exitCode(err error) int {
	var e *ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e.Code
	default:
		return 1
	}
}

// message is what cmd/submit prints for err.
func message(err error) string {
	var e *ExitError
	if errors.As(err, &e) {
		return e.Msg
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// countingStore counts the bytes put into a store.
type countingStore struct {
	store.Store
	sent atomic.Int64
}

func (c *countingStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	return c.Store.Put(ctx, key, c.count(r), size)
}

func (c *countingStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	return c.Store.PutIfAbsent(ctx, key, c.count(r), size)
}

func (c *countingStore) count(r io.Reader) io.Reader {
	return readerFunc(func(p []byte) (int, error) {
		n, err := r.Read(p)
		c.sent.Add(int64(n))
		return n, err
	})
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }
