//go:build integration

package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testcert"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// echoHost is the secret-bound host of TestJobSecretsStayOutOfEverySink.
const echoHost = "api.boxcar.test"

// sharedPart is where the test's two values overlap: the tail of one, the head of the other.
const sharedPart = "SHAREDsh4red"

// echoProfile runs one shell script the task names (sh -c), with both values bound to echoHost.
const echoProfile = `concurrency: 1
egress:
  resolver: %q
  allowed_cidrs: [%q]
  upstream_ca: %q
profiles:
  echo:
    model: {name: scripted-shell, temperature: 0}
    system_prompt: Run the command the task names with the shell tool, then say what happened.
    sandbox: {workdir: /work, disk: 16Mi, pids: 64, lifetime: 10m}
    network: {allow: [%s]}
    secrets:
      - {env: TOKEN_A, from: "env:BOXCAR_TEST_TOKEN_A", hosts: [%s]}
      - {env: TOKEN_B, from: "env:BOXCAR_TEST_TOKEN_B", hosts: [%s]}
    tools:
      - {name: shell, policy: allowlist, allow: ["sh -c *"]}
    limits: {max_turns: 4, max_tool_calls: 2, job_timeout: 3m}
`

// echoScript has the bound host echo both values in every form the proxy promises to scrub
// (docs/egress.md): in header fields and a field's name, the status line, a body cut across
// writes, trailers, Basic credentials as sent and decoded, and the two values overlapping. It
// prints the placeholders it was given, then everything curl got, and keeps it as the report.
// The body also echoes the first value in base64 after a byte of the host's own (b64Lead), as a
// token minted from a request's field would hold it.
const echoScript = `{ echo "ph=$TOKEN_A"; echo "ph2=$TOKEN_B"
basic=$(printf 'user:%s' "$TOKEN_A" | base64 -w0)
curl -sS -D - https://` + echoHost + `/echo -H "Authorization: Bearer $TOKEN_A" -H "X-Other: $TOKEN_B" -H "X-Basic: Basic $basic"
curl -sS -D - https://` + echoHost + `/status -H "Authorization: Bearer $TOKEN_A"; } 2>&1 | tee report.md`

// TestJobSecretsStayOutOfEverySink runs real jobs (bubblewrap, the worker's egress proxy, a
// scripted model) whose command has a bound host, in a network namespace of the test's, echo
// two secrets' values in every form docs/egress.md says the proxy scrubs, one job succeeding
// and one failing (a report over the limit, so dead-lettered). The sandbox must read back its
// placeholders each time, and no value, nor either value's bytes outside the other's, in any
// letters' case, may be in
// anything the worker wrote (the store's objects, its NATS files: statuses, dead letters), the
// dead letter, its log, the metrics, /readyz, what submit shows or what the model was sent.
func TestJobSecretsStayOutOfEverySink(t *testing.T) {
	t.Parallel()
	a, b := "tokA-"+randomHex(t)+sharedPart, sharedPart+randomHex(t)
	secrets := map[string]string{
		"value A": a, "value B": b, "A's Basic credentials": base64.StdEncoding.EncodeToString([]byte("user:" + a)),
		"A's bytes outside B": strings.TrimSuffix(a, sharedPart), "B's bytes outside A": strings.TrimPrefix(b, sharedPart),
		"A in base64 after a byte": base64Core(b64Lead, a),
	}
	ns := testnet.NewNetns(t)
	caFile := serveEcho(t, ns)
	dns := testnet.ServeDNS(t, func(name string) []netip.Addr {
		if name == echoHost {
			return []netip.Addr{ns.Addr}
		}
		return nil
	})
	cfg := filepath.Join(t.TempDir(), "boxcar.yaml")
	text := fmt.Sprintf(echoProfile, dns, netip.PrefixFrom(ns.Addr, 32).String(), caFile, echoHost, echoHost, echoHost)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	model := &recordingModel{}
	w := &worker{testworker.Start(t, testworker.Config{Model: model.start(t), Args: []string{"--config", cfg, "--log-level", "debug"},
		Env: harness.Env{"BOXCAR_TEST_TOKEN_A": a, "BOXCAR_TEST_TOKEN_B": b}})}

	sinks := map[string]string{}
	for _, job := range []struct{ name, script, want string }{
		{"succeeding", echoScript, "succeeded"},
		{"dead-lettered", echoScript + "; truncate -s 5M report.md", "failed"},
	} {
		id := submitShellJob(t, w, "echo", "sh", "-c", job.script)
		stdout, stderr, err := w.submit(t, "watch", id, "--timeout", "3m")
		status, _, _ := w.submit(t, "status", id, "--output", "json")
		if got := lastJSON(t, status)["state"]; got != job.want {
			t.Fatalf("the %s job ended %v (%v), want %s\n%s%s", job.name, got, err, job.want, stdout, stderr)
		}
		logs, _, _ := w.submit(t, "logs", id)
		sinks["submit's output of the "+job.name+" job"] = stdout + stderr + status + logs
		if job.want == "failed" { // its letter is written after its status: read once there
			sinks["the dead letter"] = fmt.Sprintf("%+v", waitDeadLetter(t, w.NATSURL, id, time.Minute))
		}
	}
	report := checkEchoes(t, w)
	for name, text := range map[string]string{
		"the worker's log": w.Log.String(), "the worker's stdout": w.Out.String(), "what the model was sent": model.String(),
		"/metrics": getBody(t, w.MetricsURL(t)+"/metrics"), "/readyz": getBody(t, w.MetricsURL(t)+"/readyz"), "report.md": report,
	} {
		sinks[name] = text
	}
	for name, data := range dataFiles(t, w.DataDir) {
		sinks[name] = data
	}
	for where, text := range sinks {
		for what, s := range secrets {
			if strings.Contains(strings.ToLower(text), strings.ToLower(s)) {
				t.Errorf("%s holds %s", where, what)
			}
		}
	}
}

// serveEcho starts echoHost's HTTPS server in ns on port 443 and returns its CA's file. /echo
// answers with the Bearer value, the X-Other value and the X-Basic credentials in header
// fields (and a field's name), a body (the first value also cut across two writes, flushed
// apart, and followed by the second's bytes past sharedPart) and a trailer; /status with the
// Bearer value in the status line.
func serveEcho(t *testing.T, ns *testnet.Netns) string {
	t.Helper()
	cert, caPEM := testcert.SelfSigned(t, echoHost)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: ns.Listen(t, "tcp", 443).(net.Listener), Config: &http.Server{Handler: http.HandlerFunc(echo)}}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return caFile
}

func echo(w http.ResponseWriter, r *http.Request) {
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if r.URL.Path == "/status" {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 403 not this token " + tok + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		_ = buf.Flush()
		return
	}
	other, basic := r.Header.Get("X-Other"), r.Header.Get("X-Basic")
	decoded, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(basic, "Basic "))
	w.Header().Set("Trailer", "X-Echo-Trailer")
	w.Header().Set("X-Echo-Token", tok)
	w.Header().Set("X-Echo-Basic", basic)
	w.Header().Set("X-Named-"+tok, "1") // a field named by the value, cased by both ends
	half := len(tok) / 2
	for _, part := range []string{"raw=" + tok + "\n", "cut=" + tok[:half], tok[half:] + "\n", "basic=" + string(decoded) + "\n",
		"overlap=" + tok + strings.TrimPrefix(other, sharedPart) + "\n",
		"b64=" + base64.StdEncoding.EncodeToString([]byte(b64Lead+tok)) + "\n"} {
		_, _ = io.WriteString(w, part)
		_ = http.NewResponseController(w).Flush()
	}
	w.Header().Set("X-Echo-Trailer", tok)
}

// checkEchoes reads the succeeding job's report (what curl printed) and fails unless every
// echo came back as the placeholders the sandbox sent; it returns the report.
func checkEchoes(t *testing.T, w *worker) string {
	t.Helper()
	var report string
	for name, data := range dataFiles(t, filepath.Join(w.DataDir, "store")) {
		if strings.HasSuffix(name, "report.md") && strings.Contains(data, "ph=") {
			report = data
		}
	}
	var pa, pb string
	for _, line := range strings.Split(report, "\n") {
		if v, ok := strings.CutPrefix(line, "ph="); ok {
			pa = v
		} else if v, ok := strings.CutPrefix(line, "ph2="); ok {
			pb = v
		}
	}
	if len(pa) < 20 || len(pb) < 20 {
		t.Fatalf("the report names no placeholders:\n%s", report)
	}
	overlap := pa + pb[len(sharedPart):] // the longer value's placeholder whole
	for _, want := range []string{"raw=" + pa, "cut=" + pa, base64Core(b64Lead, pa), "basic=user:" + pa, "overlap=" + overlap, "X-Echo-Token: " + pa,
		"X-Echo-Basic: Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+pa)), "X-Echo-Trailer: " + pa, "403 not this token " + pa} {
		if !strings.Contains(report, want) {
			t.Errorf("the sandbox did not read %q back; it read:\n%s", want, report)
		}
	}
	return report
}

// b64Lead is the byte the bound host's base64 echo puts before the value, so that the value's
// characters start off a base64 group's boundary.
const b64Lead = "x"

// base64Core is the characters of lead+value's base64 that hold bits of value alone: the one
// or two at either edge also hold lead's bits or padding, which the scrubber leaves as they are.
func base64Core(lead, value string) string {
	enc := base64.StdEncoding.EncodeToString([]byte(lead + value))
	from := (len(lead)*8 + 5) / 6
	to := (len(lead) + len(value)) * 8 / 6
	return enc[from:to]
}

// dataFiles is every file under dir by its path, skipping one NATS renamed away meanwhile.
func dataFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		out[p] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recordingModel is harness.ShellModel behind a proxy that keeps every request it was sent.
type recordingModel struct {
	mu  sync.Mutex
	got bytes.Buffer
}

func (m *recordingModel) start(t *testing.T) string {
	target, err := url.Parse(harness.ShellModel(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target); r.Out.URL.Path = r.In.URL.Path }}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m.mu.Lock()
		m.got.Write(body)
		m.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

func (m *recordingModel) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.got.String()
}

func getBody(t *testing.T, u string) string {
	t.Helper()
	_, body := httpGet(t, u)
	return string(body)
}

func randomHex(t *testing.T) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}
