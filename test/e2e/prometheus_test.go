//go:build integration

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/spawn"
	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/harness"
)

// need finds a command the test runs, or fails with how to install it.
func need(t *testing.T, command, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(command)
	if err != nil {
		t.Fatalf("%s not found: apt-get install -y %s", command, pkg)
	}
	return p
}

func httpGet(t *testing.T, u string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	return resp.StatusCode, body
}

// TestPrometheus runs jobs on a worker, checks its scrape with `promtool check metrics`, then
// has a real Prometheus server scrape the worker and answers the job count over its HTTP API.
func TestPrometheus(t *testing.T) {
	t.Parallel()
	promtool := need(t, "promtool", "prometheus")
	prometheus := need(t, "prometheus", "prometheus")

	w := startWorker(t, demoModel(t))
	base := "http://" + w.Addrs().Metrics

	const jobs = 2
	for i := range jobs {
		stdout, stderr, err := w.submit(t, "run", "--profile", "csv-analyst", "--task", fmt.Sprintf("Summarise sales.csv (%d)", i),
			"--input", "../../examples/sales.csv", "--wait", "--output", "json")
		if err != nil {
			t.Fatalf("submit run: %v\n%s", err, stderr)
		}
		if st := lastJSON(t, stdout)["state"]; st != "succeeded" {
			t.Fatalf("job %d: state %v, want succeeded", i, st)
		}
	}
	// A job no worker can run (submit refuses it; another client may send it): rejected and
	// dead-lettered.
	if _, _, err := w.submit(t, "run", "--profile", "no-such-profile", "--task", "x", "--wait"); exitCode(err) != 4 {
		t.Fatalf("unknown profile: exit %d (%v), want 4", exitCode(err), err)
	}
	publishUnchecked(t, w.NATSURL, "no-such-profile")

	for path, want := range map[string]int{"/healthz": http.StatusOK, "/readyz": http.StatusOK} {
		if code, body := httpGet(t, base+path); code != want {
			t.Errorf("%s = %d %s, want %d", path, code, body, want)
		}
	}

	want := []string{
		`boxcar_jobs_total{outcome="succeeded",profile="csv-analyst"} 2`,
		// A profile the worker does not define is not a label value: anyone can submit one.
		`boxcar_jobs_total{outcome="rejected",profile="unknown"} 1`,
		`boxcar_dead_letters_total{reason="unknown_profile"} 1`,
		`boxcar_model_requests_total{outcome="ok"} `,
		`boxcar_model_request_duration_seconds_count{outcome="ok"} `,
		`boxcar_model_tokens_total{kind="prompt",profile="csv-analyst"} `,
		`boxcar_tool_calls_total{outcome="ok",profile="csv-analyst",tool="csv_stats"} 2`,
		`boxcar_sandbox_start_seconds_count{backend="bubblewrap"} 2`,
		`boxcar_sandbox_exec_seconds_count{backend="bubblewrap"} `,
		`boxcar_sandbox_close_seconds_count{backend="bubblewrap"} 2`,
		`boxcar_job_queue_wait_seconds_count{profile="csv-analyst"} 2`,
		`boxcar_queue_pending_jobs{tenant="default"} 0`,
		`boxcar_queue_ack_pending_jobs{tenant="default"} 0`,
		`boxcar_jobs_in_flight 0`,
		`boxcar_worker_slots_free 2`,
	}
	// `submit --wait` returns once the job's status is final; the worker settles with the queue
	// and frees the slot just after.
	var scrape []byte
	harness.Wait(t, "the scrape shows both jobs settled", func() (bool, error) {
		var code int
		code, scrape = httpGet(t, base+"/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics = %d", code)
		}
		var missing []string
		for _, w := range want {
			if !bytes.Contains(scrape, []byte("\n"+w)) {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0, fmt.Errorf("the scrape lacks %q", missing)
	})
	// Logged once the address is bound, before the first scrape can succeed.
	if !strings.Contains(w.Log.String(), `"msg":"metrics listening","addr":"`+w.Addrs().Metrics+`"`) {
		t.Errorf("the worker did not log its metrics address %s", w.Addrs().Metrics)
	}
	if regexp.MustCompile(`job_id=`).Match(scrape) {
		t.Error("a metric carries a job_id label")
	}

	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = bytes.NewReader(scrape)
	if out, err := check.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	// A real Prometheus server scraping the worker.
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: boxcar
    static_configs:
      - targets: [%q]
`, w.Addrs().Metrics)
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	promLog := &harness.LogBuffer{}
	prom := exec.Command(prometheus,
		"--config.file="+cfgFile,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:0", // the port it bound is read back below
	)
	prom.Stdout, prom.Stderr = promLog, promLog
	if err := spawn.Start(prom); err != nil { // never outlives the test binary
		t.Fatalf("start prometheus: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- prom.Wait() }()
	t.Cleanup(func() {
		_ = prom.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = prom.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", promLog.String())
		}
	})

	query := `sum(boxcar_jobs_total{job="boxcar",outcome="succeeded"})`
	var promAddr string
	harness.Wait(t, fmt.Sprintf("Prometheus answers %s = %d", query, jobs), func() (bool, error) {
		select {
		case err := <-exited:
			t.Fatalf("prometheus exited: %v\n%s", err, promLog.String())
		default:
		}
		if promAddr == "" {
			addr, err := testnet.ListeningAddr(prom.Process.Pid)
			if addr == "" {
				return false, fmt.Errorf("prometheus not listening yet (%v)", err)
			}
			promAddr = addr
		}
		v, err := promQuery(promAddr, query)
		if err != nil {
			return false, err
		}
		return v == fmt.Sprint(jobs), errors.New(v)
	}, harness.Within(120*time.Second))
}

// promQuery runs an instant query against Prometheus's HTTP API and returns the single value.
func promQuery(addr, query string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u := "http://" + addr + "/api/v1/query?query=" + url.QueryEscape(query)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var res struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return "", fmt.Errorf("query %s: %w", query, err)
	}
	switch {
	case res.Status != "success":
		return "", fmt.Errorf("query %s: %s", query, res.Error)
	case len(res.Data.Result) == 0:
		return "", fmt.Errorf("query %s: no result yet", query)
	}
	v, _ := res.Data.Result[0].Value[1].(string)
	return v, nil
}
