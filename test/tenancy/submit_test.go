//go:build integration

package tenancy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/submitcmd"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// fleet is the deployment with a real worker: worker.creds over mTLS, bubblewrap sandboxes,
// a file store, the scripted model; and what each identity's `submit` needs.
type fleet struct {
	*deployment
	store  string            // store.url
	keys   map[string]string // tenant -> its approver's private key file
	w      *testworker.Worker
	said   bytes.Buffer // everything every submit printed, for the scan for secrets
	secret []string     // every seed, key and password of the deployment
}

// workerConfig is the worker's config: two tenants, a shell profile under the "ask" policy
// granted to both, and one granted to team-b only.
const workerConfig = `concurrency: 4
nats:
  url: %s
  ack_wait: 5s
store:
  url: %s
sandbox:
  backend: bubblewrap
approver_keyring: %s
tenants:
  team-a:
    profiles: [shell-ask]
  team-b:
    profiles: [shell-ask, b-only]
profiles:
  shell-ask: &shell
    description: Runs one command a person of the job's tenant approves.
    model:
      name: scripted-shell
      temperature: 0
    system_prompt: Run the command the task names with the shell tool, then say what happened.
    sandbox:
      workdir: /work
      disk: 16Mi
      pids: 32
      lifetime: 10m
    tools:
      - name: shell
        policy: ask
    limits:
      max_turns: 4
      max_tool_calls: 2
      approval_timeout: 10m
      job_timeout: 15m
  b-only: *shell
`

// startFleet sets the layout up as the operator, makes each tenant's approver key and the
// worker's keyring, and starts the worker with worker.creds over mTLS.
func startFleet(t *testing.T) *fleet {
	t.Helper()
	d := deploy(t)
	setUp(t, d)
	dir := t.TempDir()
	f := &fleet{deployment: d, store: "file://" + filepath.Join(dir, "store"), keys: map[string]string{}, secret: d.seeds}
	var ring strings.Builder
	ring.WriteString("keys:\n")
	for _, tn := range tenants {
		kd := filepath.Join(dir, "keys", tn)
		if out, err := f.submit(t, "", "keygen", "--out", kd); err != nil {
			t.Fatalf("submit keygen: %v\n%s", err, out)
		}
		f.keys[tn] = filepath.Join(kd, "signing.key")
		pem, err := os.ReadFile(f.keys[tn])
		if err != nil {
			t.Fatal(err)
		}
		f.secret = append(f.secret, pemBody(string(pem)))
		fmt.Fprintf(&ring, "  - name: %s-approver\n    public_key_file: %s\n", tn, filepath.Join(kd, "signing.pub"))
	}
	keyring := filepath.Join(dir, "approvers.yaml")
	cfg := filepath.Join(dir, "boxcar.yaml")
	if err := os.WriteFile(keyring, []byte(ring.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, fmt.Appendf(nil, workerConfig, d.url, f.store, keyring), 0o600); err != nil {
		t.Fatal(err)
	}
	f.secret = append(f.secret, testworker.APIKey)
	f.w = testworker.Start(t, testworker.Config{ConfigFile: cfg, Model: harness.ShellModel(t), Env: harness.Env{
		"NATS_CREDS": d.creds["worker"], "NATS_CA": d.certs.CA, "NATS_CERT": d.certs.ClientCert, "NATS_KEY": d.certs.ClientKey,
		"BOXCAR_HOME": t.TempDir(),
	}})
	return f
}

// pemBody is the base64 of a PEM block: what would leak of a private key.
func pemBody(pem string) string {
	var b strings.Builder
	for l := range strings.Lines(pem) {
		if !strings.HasPrefix(l, "-----") {
			b.WriteString(strings.TrimSpace(l))
		}
	}
	return b.String()[:40]
}

// submit runs the real submit command as an identity (empty: none) of its tenant, with its
// .creds file over mTLS, and returns what it printed.
func (f *fleet) submit(t *testing.T, identity string, args ...string) (string, error) {
	t.Helper()
	env := harness.Env{"BOXCAR_HOME": t.TempDir(), "BOXCAR_STORE": f.store}
	if identity != "" {
		tenant, approver := strings.CutSuffix(identity, "-approver")
		if approver {
			env = env.With("BOXCAR_APPROVER_KEY", f.keys[tenant])
		} else {
			tenant = strings.TrimSuffix(identity, "-submitter")
		}
		env = env.With("NATS_URL", f.url, "NATS_CREDS", f.creds[identity], "NATS_CA", f.certs.CA,
			"NATS_CERT", f.certs.ClientCert, "NATS_KEY", f.certs.ClientKey, "BOXCAR_TENANT", tenant)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := submitcmd.Run(ctx, args, env.Getenv, &out, &out)
	f.said.WriteString(out.String())
	if err != nil {
		f.said.WriteString(err.Error() + "\n")
	}
	return out.String(), err
}

// shellJob submits, as a tenant's submitter, a job whose command waits for an approval, and
// waits until its approver sees the request.
func (f *fleet) shellJob(t *testing.T, tenant string, argv ...string) string {
	t.Helper()
	cmd, _ := json.Marshal(argv)
	out, err := f.submit(t, tenant+"-submitter", "run", "--profile", "shell-ask", "--task", "Run this.\nRUN: "+string(cmd), "--output", "json")
	if err != nil {
		t.Fatalf("%s submits: %v\n%s", tenant, err, out)
	}
	var res struct{ ID string }
	if err := json.Unmarshal([]byte(lastLine(out)), &res); err != nil || res.ID == "" {
		t.Fatalf("submit run --output json: %v\n%s", err, out)
	}
	harness.Wait(t, tenant+"'s job "+res.ID+" asks for an approval", func() (bool, error) {
		out, err := f.submit(t, tenant+"-approver", "approvals", res.ID, "--output", "json")
		return err == nil && strings.Contains(out, harness.ShellCallID), fmt.Errorf("%v: %s", err, out)
	})
	return res.ID
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// view is what team-b sees of its job: its status and its approval request.
func (f *fleet) view(t *testing.T, id string) string {
	t.Helper()
	st, err := f.submit(t, "team-b-submitter", "status", id, "--output", "json")
	if err != nil {
		t.Fatalf("team-b's status of its job: %v\n%s", err, st)
	}
	ap, err := f.submit(t, "team-b-approver", "approvals", id, "--output", "json")
	if err != nil {
		t.Fatalf("team-b's approval requests: %v\n%s", err, ap)
	}
	var s map[string]any
	if err := json.Unmarshal([]byte(lastLine(st)), &s); err != nil {
		t.Fatalf("status --output json: %v\n%s", err, st)
	}
	// What changes by itself while the job waits: the heartbeat's progress and timestamps.
	return fmt.Sprint(s["state"], s["cancel_requested"], s["attempt"], s["error"]) + "\n" + ap
}

// TestSubmitAcrossTenantsWithAWorkerOverMTLS runs the real worker with worker.creds over mTLS
// and the real submit command of each tenant's identities: every attempt of team-a's
// submitter and approver on team-b's job, and of one role in the other's place, is refused
// with an error that says so and changes nothing of team-b's; team-a's own path works (its
// job runs on the worker, its approver approves its command, it ends succeeded), and so does
// team-b's. The worker's log, /readyz and everything submit printed hold none of the
// deployment's seeds, keys or passwords.
func TestSubmitAcrossTenantsWithAWorkerOverMTLS(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	idB := f.shellJob(t, "team-b", "echo", "team-b's own output")
	idA := f.shellJob(t, "team-a", "echo", "hello from team-a")
	before := f.view(t, idB)

	sa, aa := "team-a-submitter", "team-a-approver"
	rows := []struct {
		name string
		as   string
		args []string
		want string // in what submit printed or returned
	}{
		{name: "submitter reads the status of team-b's job", as: sa, args: []string{"status", idB}, want: "unknown job"},
		{name: "submitter watches team-b's job", as: sa, args: []string{"watch", idB, "--timeout", "20s"}, want: "unknown job"},
		{name: "submitter cancels team-b's job", as: sa, args: []string{"cancel", idB}, want: "unknown job"},
		{name: "submitter approves team-b's command", as: sa, args: []string{"approve", idB, harness.ShellCallID, "--yes", "--key", f.keys["team-a"]}, want: "no such approval request"},
		{name: "submitter denies team-b's command", as: sa, args: []string{"deny", idB, harness.ShellCallID, "--yes", "--key", f.keys["team-a"]}, want: "no such approval request"},
		{name: "submitter lists team-b's approval requests", as: sa, args: []string{"approvals", idB, "--output", "json"}, want: "unknown job"},
		{name: "submitter submits as team-b", as: sa, args: []string{"run", "--tenant", "team-b", "--profile", "shell-ask", "--task", "RUN: [\"id\"]"}, want: "refused by the NATS server"},
		{name: "submitter submits a profile not granted to team-a", as: sa, args: []string{"run", "--profile", "b-only", "--task", "RUN: [\"id\"]"}, want: "b-only"},
		{name: "submitter approves its own tenant's command (approvers only)", as: sa, args: []string{"approve", idA, harness.ShellCallID, "--yes", "--key", f.keys["team-a"]}, want: "refused by the NATS server"},
		{name: "approver approves team-b's command", as: aa, args: []string{"approve", idB, harness.ShellCallID, "--yes"}, want: "no such approval request"},
		{name: "approver denies team-b's command", as: aa, args: []string{"deny", idB, harness.ShellCallID, "--yes"}, want: "no such approval request"},
		{name: "approver reads the status of team-b's job", as: aa, args: []string{"status", idB}, want: "unknown job"},
		{name: "approver submits a job (submitters only)", as: aa, args: []string{"run", "--profile", "shell-ask", "--task", "RUN: [\"id\"]"}, want: "refused by the NATS server"},
		{name: "approver cancels its tenant's job (submitters only)", as: aa, args: []string{"cancel", idA}, want: "refused by the NATS server"},
	}
	refused := 0
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			out, err := f.submit(t, r.as, r.args...)
			said := out
			if err != nil {
				said += err.Error()
			}
			switch {
			case err == nil:
				t.Errorf("%s %v: %v\n%s; want it refused", r.as, r.args, err, out)
			case !strings.Contains(strings.ReplaceAll(said, " ", ""), strings.ReplaceAll(r.want, " ", "")):
				t.Errorf("%s %v: %v\n%s\nwant it to say %q", r.as, r.args, err, out, r.want)
			default:
				refused++
			}
			if strings.Contains(said, "team-b's own output") {
				t.Errorf("%s %v printed team-b's output:\n%s", r.as, r.args, said)
			}
		})
	}

	// The same identities' raw NATS and JetStream attempts, against the live deployment.
	raw, told := runAttempts(t, f.deployment, crossAttempts(t, f.deployment, idA, idB))
	f.said.WriteString(strings.Join(told, "\n"))
	if after := f.view(t, idB); after != before {
		t.Errorf("team-a's attempts changed team-b's job:\nbefore %s\nafter  %s", before, after)
	}

	// The legitimate paths: each tenant's approver approves its command, the job runs on the
	// worker and succeeds, and its submitter gets the run.
	for _, j := range []struct{ tenant, id, output string }{{"team-a", idA, "hello from team-a"}, {"team-b", idB, "team-b's own output"}} {
		if out, err := f.submit(t, j.tenant+"-approver", "approve", j.id, harness.ShellCallID, "--yes"); err != nil {
			t.Fatalf("%s's approver approves its command: %v\n%s", j.tenant, err, out)
		}
		out, err := f.submit(t, j.tenant+"-submitter", "watch", j.id, "--output", "json", "--timeout", "3m")
		if err != nil || !strings.Contains(lastLine(out), `"succeeded"`) {
			t.Fatalf("%s's job after approval: %v\n%s; want succeeded", j.tenant, err, out)
		}
		dir := t.TempDir()
		if out, err := f.submit(t, j.tenant+"-submitter", "get", j.id, "--out", dir); err != nil {
			t.Fatalf("%s gets its run: %v\n%s", j.tenant, err, out)
		}
		report, err := os.ReadFile(filepath.Join(dir, "report.md"))
		if err != nil || !strings.Contains(string(report), j.output) {
			t.Errorf("%s's report: %v\n%s; want the command's output %q", j.tenant, err, report, j.output)
		}
	}

	// team-b's run, committed now, is not team-a's to get.
	if out, err := f.submit(t, sa, "get", idB, "--out", t.TempDir()); err == nil || !strings.Contains(out+err.Error(), "no results for job "+idB) {
		t.Errorf("team-a gets team-b's finished run: %v\n%s; want no results in team-a's store", err, out)
	} else {
		refused++
	}
	// Squatting: team-a's `run --id` of team-b's id is team-a's own job, which team-a cancels;
	// team-b's job and run are as they were.
	doneB := f.view(t, idB)
	out, err := f.submit(t, sa, "run", "--id", idB, "--profile", "shell-ask", "--task", "RUN: [\"true\"]")
	if err != nil {
		t.Errorf("team-a's run --id %s (an id of team-b's): %v\n%s; want its own job under that id", idB, err, out)
	} else {
		refused++
	}
	if out, err := f.submit(t, sa, "cancel", idB); err != nil {
		t.Errorf("team-a cancels its own job %s: %v\n%s", idB, err, out)
	}
	if after := f.view(t, idB); after != doneB {
		t.Errorf("team-a's job under team-b's id changed team-b's:\nbefore %s\nafter  %s", doneB, after)
	}
	dir := t.TempDir()
	if out, err := f.submit(t, "team-b-submitter", "get", idB, "--out", dir); err != nil {
		t.Errorf("team-b gets its run after team-a used its id: %v\n%s", err, out)
	} else if report, err := os.ReadFile(filepath.Join(dir, "report.md")); err != nil || !strings.Contains(string(report), "team-b's own output") {
		t.Errorf("team-b's report after team-a used its id: %v\n%s", err, report)
	}
	t.Logf("%d of %d cross-tenant and cross-role attempts through submit and %d of %d through raw NATS refused, team-b's job unchanged", refused, len(rows)+2, raw, len(crossAttempts(t, f.deployment, idA, idB)))

	readyz := httpBody(t, f.w.MetricsURL(t)+"/readyz")
	noSecrets(t, "the worker's log", f.w.Log.String(), f.secret)
	noSecrets(t, "the worker's stdout", f.w.Out.String(), f.secret)
	noSecrets(t, "/readyz", readyz, f.secret)
	noSecrets(t, "what submit printed", f.said.String(), f.secret)
	t.Logf("scanned %d bytes of worker log, %d of /readyz, %d of submit output for %d secrets", len(f.w.Log.String()), len(readyz), f.said.Len(), len(f.secret))
}

func httpBody(t *testing.T, u string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return string(body)
}
