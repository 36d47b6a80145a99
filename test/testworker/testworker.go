// Package testworker starts a worker in-process for a test, through workercmd.Start, from a
// typed Config: its NATS, store, model, profiles and sandbox backend. Readiness and addresses
// come from the workercmd.Worker, never from its log. The wait, the buffers and child-process
// workers are test/harness's; this package is apart because it imports workercmd, which the
// tests of the packages workercmd imports cannot.
//
// Only tests import it: depguard keeps test/... out of the binaries.
package testworker

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/connflags"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/workercmd"
	"github.com/boxcar-run/boxcar/test/harness"
)

// APIKey is the model API key test workers get unless Config.Env names one: a value tests look
// for in logs, transcripts and manifests, where it must never be.
const APIKey = "sk-e2e-secret-never-logged"

// Config is what a test worker needs. The zero value is an embedded worker (its own NATS on a
// free port, the file store under its data dir) with the example profiles, bubblewrap
// sandboxes and the scripted demo model.
type Config struct {
	// NATS is nats.url; empty runs the worker --embedded.
	NATS string
	// NATSYAML is more keys under nats:, one "key: value" a line ("ack_wait: 3s").
	NATSYAML string
	// Store is store.url. Default: a file store in a temp dir. Not with an embedded worker.
	Store string
	// StoreYAML is more keys under store: ("endpoint: http://…").
	StoreYAML string
	// Model is the model's base URL (OPENAI_BASE_URL). Default: the scripted demo model,
	// started for the test.
	Model string
	// Profiles is the config the sections are added to. Default: the example profiles
	// (examples.Config). Not with an embedded worker, which uses them.
	Profiles string
	// Backend is sandbox.backend. Default: bubblewrap.
	Backend string
	// YAML is more top-level keys ("drain_grace: 5s\n").
	YAML string
	// ConfigFile is a whole config file, in place of every setting above but Model.
	ConfigFile string
	// Env is the worker's whole environment; OPENAI_BASE_URL (Model) and OPENAI_API_KEY
	// (APIKey) are added unless set.
	Env harness.Env
	// Args are more flags ("--log-level", "debug"). The metrics endpoint binds a free port
	// unless they say otherwise.
	Args []string
	// DataDir is an embedded worker's data dir. Default: a temp dir.
	DataDir string
}

// Worker is a started worker: workercmd's, with what it writes and how to reach it.
type Worker struct {
	*workercmd.Worker
	Log, Out *harness.LogBuffer // its JSON log (stderr) and stdout
	DataDir  string             // an embedded worker's data dir
	// Submit is the environment submit reaches the worker's NATS and store with (an embedded
	// worker's NATS once Ready has closed).
	Submit harness.Env
	// NATSURL is the NATS URL a test's own client uses: Config.NATS, or the embedded worker's
	// with its token once Ready has closed.
	NATSURL string

	stopOnce sync.Once
}

// Start starts a worker with cfg, stops it when the test ends, and waits until it takes jobs.
func Start(t testing.TB, cfg Config) *Worker {
	t.Helper()
	w := Launch(t, cfg)
	w.WaitReady(t)
	return w
}

// Launch is Start without the wait: for a worker that waits for its NATS or store.
func Launch(t testing.TB, cfg Config) *Worker {
	t.Helper()
	w := &Worker{Log: &harness.LogBuffer{}, Out: &harness.LogBuffer{}}
	args := options(t, &cfg, w)
	o, err := workercmd.ParseOptions(args)
	if err != nil {
		t.Fatal(err)
	}
	o.Getenv, o.Stdout, o.Stderr = cfg.Env.Getenv, w.Out, w.Log
	if w.Worker, err = workercmd.Start(context.WithoutCancel(t.Context()), o); err != nil {
		t.Fatalf("start the worker: %v\n%s", err, w.Log.String())
	}
	t.Cleanup(func() { w.Stop(t) })
	return w
}

// options fills cfg's defaults and returns the worker's flags.
func options(t testing.TB, cfg *Config, w *Worker) []string {
	t.Helper()
	if cfg.Model == "" {
		srv := httptest.NewServer(demomodel.Handler())
		t.Cleanup(srv.Close)
		cfg.Model = srv.URL + "/v1"
	}
	cfg.Env = cfg.Env.With()
	for k, v := range map[string]string{"OPENAI_BASE_URL": cfg.Model, "OPENAI_API_KEY": APIKey} {
		if cfg.Env[k] == "" {
			cfg.Env[k] = v
		}
	}
	args := []string{"--metrics-addr", "127.0.0.1:0"}
	if cfg.NATS == "" && cfg.ConfigFile == "" {
		w.DataDir = cfg.DataDir
		if w.DataDir == "" {
			w.DataDir = t.TempDir()
		}
		w.Submit = harness.Env{"BOXCAR_HOME": w.DataDir}
		return append(append(args, "--embedded", "--data-dir", w.DataDir, "--nats-listen", "127.0.0.1:0"), cfg.Args...)
	}
	if cfg.ConfigFile == "" {
		cfg.ConfigFile = writeConfig(t, cfg)
		// The worker's environment (the store's credentials, NATS's login) and where it is.
		w.Submit = cfg.Env.With("NATS_URL", cfg.NATS, "BOXCAR_STORE", cfg.Store)
		w.NATSURL = cfg.NATS
	}
	return append(append(args, "--config", cfg.ConfigFile), cfg.Args...)
}

// writeConfig writes cfg's config file and returns its path.
func writeConfig(t testing.TB, cfg *Config) string {
	t.Helper()
	if cfg.Store == "" {
		cfg.Store = "file://" + t.TempDir()
	}
	if cfg.Profiles == "" {
		cfg.Profiles = string(examples.Config)
	}
	if cfg.Backend == "" {
		cfg.Backend = "bubblewrap"
	}
	text := fmt.Sprintf("%s\n%s\nsandbox:\n  backend: %s\nnats:\n  url: %s\n%sstore:\n  url: %s\n%s",
		cfg.Profiles, cfg.YAML, cfg.Backend, cfg.NATS, indent(cfg.NATSYAML), cfg.Store, indent(cfg.StoreYAML))
	path := filepath.Join(t.TempDir(), "boxcar.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func indent(lines string) string {
	var b strings.Builder
	for l := range strings.Lines(lines) {
		b.WriteString("  " + strings.TrimRight(l, "\n") + "\n")
	}
	return b.String()
}

// WaitReady waits until the worker takes jobs and returns its addresses; it fails the test
// when the worker stops first.
func (w *Worker) WaitReady(t testing.TB) workercmd.Addrs {
	t.Helper()
	select {
	case <-w.Ready():
	case <-w.Done():
		t.Fatalf("worker exited before it was ready: %v\n%s", w.Wait(), w.Log.String())
	case <-time.After(harness.Timeout(harness.DefaultTimeout)):
		t.Fatalf("worker not ready within %s\n%s", harness.Timeout(harness.DefaultTimeout), w.Log.String())
	}
	a := w.Addrs()
	if w.NATSURL == "" {
		w.NATSURL = a.NATS
	}
	if w.DataDir != "" {
		w.NATSURL = tokenURL(t, a.NATS, w.DataDir)
		w.Submit = w.Submit.With("NATS_URL", a.NATS)
	}
	return a
}

// MetricsURL is the base URL of /metrics, /healthz and /readyz, waited for: the endpoint
// listens before the worker waits for NATS or the store.
func (w *Worker) MetricsURL(t testing.TB) string {
	t.Helper()
	harness.Wait(t, "the worker's metrics endpoint", func() (bool, error) {
		return w.Addrs().Metrics != "", w.Alive()
	})
	return "http://" + w.Addrs().Metrics
}

// Alive is nil while the worker runs; once it has stopped, an error wrapping harness.ErrStop,
// which ends a harness.Wait at once.
func (w *Worker) Alive() error {
	select {
	case <-w.Done():
		return fmt.Errorf("%w: the worker exited: %v", harness.ErrStop, w.Wait())
	default:
		return nil
	}
}

// Stop drains the worker, as SIGTERM does, and checks that it stops cleanly; once, however
// often it is called. It logs the worker's log when the test failed.
func (w *Worker) Stop(t testing.TB) {
	w.stopOnce.Do(func() {
		w.Worker.Stop()
		select {
		case <-w.Done():
			if err := w.Wait(); err != nil && !t.Failed() {
				t.Errorf("worker stopped with %v", err)
			}
		case <-time.After(harness.Timeout(harness.DefaultTimeout)):
			t.Errorf("worker did not stop within %s", harness.Timeout(harness.DefaultTimeout))
		}
		if t.Failed() {
			t.Logf("worker log:\n%s", w.Log.String())
		}
	})
}

// tokenURL is the embedded worker's NATS URL with the token it keeps in its data dir, for a
// test's raw NATS clients (submit finds the token itself through BOXCAR_HOME).
func tokenURL(t testing.TB, natsURL, dataDir string) string {
	t.Helper()
	tok, err := connflags.ReadSecretFile(filepath.Join(dataDir, connflags.EmbeddedTokenFile))
	if err != nil {
		t.Fatalf("the embedded worker's NATS token: %v", err)
	}
	return strings.Replace(natsURL, "://", "://"+tok+"@", 1)
}
