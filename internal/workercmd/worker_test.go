package workercmd

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/connflags"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// readyTimeout bounds a wait for an embedded worker to start on a busy CI machine: it is no
// statement about speed.
const readyTimeout = 2 * time.Minute

// TestStartReadyStopWait: Start returns a worker whose Ready closes once it takes jobs, with
// the addresses a test or a parent process needs (no log line to look for), the same addresses
// in the ready file; Stop drains it, Wait returns nil, the ready file is gone.
func TestStartReadyStopWait(t *testing.T) {
	dir := t.TempDir()
	readyFile := filepath.Join(dir, "ready.json")
	prev, prevFlags := log.Writer(), log.Flags()
	t.Cleanup(func() { log.SetOutput(prev); log.SetFlags(prevFlags) })
	var stderr testharness.LogBuffer
	w, err := Start(t.Context(), Options{Embedded: true, DataDir: dir, NATSListen: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		ReadyFile: readyFile, Getenv: noEnv, Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, w)
	// What a library writes to the standard logger may be a bound host's answer, unscrubbed.
	log.Printf("Unsolicited response received on idle HTTP channel starting with %q", "sk-quoted-by-upstream")
	if out := stderr.String(); strings.Contains(out, "sk-quoted-by-upstream") || !strings.Contains(out, `"source":"worker_test.go:`) {
		t.Errorf("the worker's log of a line written to the standard logger:\n%s", out)
	}
	addrs := w.Addrs()
	if !strings.HasPrefix(addrs.NATS, "nats://127.0.0.1:") || addrs.NATS == "nats://127.0.0.1:4222" || addrs.Metrics == "" || !strings.HasPrefix(addrs.Store, "file://"+filepath.Join(dir, "store")) {
		t.Errorf("Addrs = %+v, want the embedded server on a free port, the metrics address and the file store", addrs)
	}
	// The embedded NATS wants the token it wrote to the data dir, mode 0600.
	if nc, err := nats.Connect(addrs.NATS); err == nil {
		nc.Close()
		t.Error("the embedded NATS let a client in without its token")
	}
	tok, err := connflags.ReadSecretFile(filepath.Join(dir, connflags.EmbeddedTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(addrs.NATS, nats.Token(tok))
	if err != nil {
		t.Fatalf("connect to the embedded NATS at %s with its token: %v", addrs.NATS, err)
	}
	nc.Close()
	resp, err := http.Get("http://" + addrs.Metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz of a ready worker: %s", resp.Status)
	}
	data, err := os.ReadFile(readyFile)
	if err != nil {
		t.Fatalf("ready file: %v", err)
	}
	var inFile Addrs
	if err := json.Unmarshal(data, &inFile); err != nil || inFile != addrs {
		t.Errorf("ready file %s = %+v (%v), want %+v", data, inFile, err, addrs)
	}
	w.Stop()
	if err := w.Wait(); err != nil {
		t.Errorf("Wait after Stop: %v", err)
	}
	if _, err := os.Stat(readyFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ready file after the worker stopped: %v, want it removed", err)
	}
}

// TestStartFailsAtOnce: a setting no wait can fix is Start's error, before anything runs.
func TestStartFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "boxcar.yaml")
	if err := os.WriteFile(bad, []byte("concurency: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"bad config", Options{ConfigPath: bad, DataDir: dir}, bad + ":1:1 concurency: unknown key"},
		{"no config", Options{DataDir: dir}, "no --config"},
		{"log level", Options{Embedded: true, DataDir: dir, LogLevel: "loud"}, "--log-level"},
		{"listen address", Options{Embedded: true, DataDir: dir, NATSListen: "127.0.0.1"}, "--nats-listen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), readyTimeout)
			defer cancel()
			w, err := Start(ctx, tt.o)
			if err == nil {
				w.Stop()
				t.Fatalf("Start: %+v, want an error with %q (Wait: %v)", w, tt.want, w.Wait())
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start: %v, want %q", err, tt.want)
			}
		})
	}
}

func TestParseOptions(t *testing.T) {
	o, err := ParseOptions([]string{"--embedded", "-config", "x.yaml", "--ready-file=r.json", "--nats-listen", "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.Embedded || o.ConfigPath != "x.yaml" || o.ReadyFile != "r.json" || o.NATSListen != "127.0.0.1:0" || o.LogLevel != "info" {
		t.Errorf("ParseOptions = %+v", o)
	}
	if _, err := ParseOptions([]string{"--frob"}); err == nil {
		t.Error("ParseOptions accepts an unknown flag")
	}
}

// waitReady stops w when the test ends and waits until it takes jobs.
func waitReady(t *testing.T, w *Worker) {
	t.Helper()
	t.Cleanup(func() { w.Stop(); _ = w.Wait() })
	select {
	case <-w.Ready():
	case <-w.Done():
		t.Fatalf("the worker stopped before it was ready: %v", w.Wait())
	case <-time.After(readyTimeout):
		t.Fatal("the worker was not ready within", readyTimeout)
	}
}

// TestDataDirFromGetenvHome: an embedded worker without --data-dir or BOXCAR_HOME keeps its
// data under the HOME its Getenv gives, not the process's: workers in one process each get
// their own. Without any, it stops at start and names the fix.
func TestDataDirFromGetenvHome(t *testing.T) {
	home := t.TempDir()
	w, err := Start(t.Context(), Options{Embedded: true, NATSListen: "127.0.0.1:0", MetricsAddr: "off",
		Getenv: func(k string) string { return map[string]string{"HOME": home}[k] }})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, w)
	if want := "file://" + filepath.Join(home, ".boxcar", "store"); !strings.HasPrefix(w.Addrs().Store, want) {
		t.Errorf("store %s, want under %s", w.Addrs().Store, want)
	}
	if _, err := Start(t.Context(), Options{Embedded: true, NATSListen: "127.0.0.1:0", MetricsAddr: "off", Getenv: noEnv}); err == nil || !strings.Contains(err.Error(), "--data-dir") {
		t.Errorf("an embedded worker without HOME: %v, want an error naming --data-dir", err)
	}
}

// TestBadMetricsAddrFlagStopsStart: a --metrics-addr the worker cannot listen on stops Start at
// once, named with the fix, as the config's metrics_addr does at load; before, the worker
// started and its /metrics failed once it was up.
func TestBadMetricsAddrFlagStopsStart(t *testing.T) {
	t.Parallel()
	w, err := Start(t.Context(), Options{Embedded: true, DataDir: t.TempDir(), NATSListen: "127.0.0.1:0", MetricsAddr: "9464", Getenv: noEnv})
	if err == nil {
		w.Stop()
		t.Fatal("Start with --metrics-addr 9464 succeeded; want it refused")
	}
	if want := `--metrics-addr: "9464" is not host:port; give 127.0.0.1:9464`; !strings.Contains(err.Error(), want) {
		t.Errorf("Start: %v; want %q", err, want)
	}
}
