package cluster_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	helmkube "helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/strvals"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// authTenants are the tenants TestHelmInstallNATSAuth generates identities for.
var authTenants = []string{"team-a", "team-b"}

// TestHelmInstallNATSAuth (issue 23) installs the chart against a NATS that authenticates,
// from the identities `worker nats-config` generates for two tenants: the server includes its
// auth.conf from a Secret as the NATS chart would, the workers run with worker.creds (which may
// only bind, never create streams) and the chart's pre-install hook runs `worker setup` with
// operator.creds. Before that, `helm install` with the sandbox namespace equal to the release's
// is refused with a message naming the value. Each tenant's submitter runs a job through
// `submit` with its own .creds; each succeeds, and its signed manifest is under the tenant's
// prefix with the tenant the worker saw. A submit without credentials, one with team-b's
// credentials acting for team-a and one by team-a's approver are refused, and the server took
// nothing of them. `helm upgrade` runs the hook again before the workers roll. No seed of any
// identity is in the release's rendered objects (hooks included), a ConfigMap, or a log of the
// workers or NATS.
func TestHelmInstallNATSAuth(t *testing.T) {
	ctx := t.Context()
	ids := generateIdentities(t, authTenants)
	apiKey := "sk-helm-auth-marker-" + rand.Text()
	r := setupReleaseWith(t, apiKey, readFile(t, filepath.Join(ids.dir, "auth.conf")))
	createSecret(t, r.ns, "boxcar-nats-worker", map[string][]byte{"nats.creds": []byte(readFile(t, ids.creds["worker"]))})
	createSecret(t, r.ns, "boxcar-nats-operator", map[string][]byte{"nats.creds": []byte(readFile(t, ids.creds["operator"]))})

	refuseSandboxNamespace(t, r)

	vals := r.vals
	sets := []string{
		"natsServer.credentialsSecret.name=boxcar-nats-worker",
		"natsServer.operatorCredentialsSecret.name=boxcar-nats-operator",
		"natsServer.account=" + ids.account,
	}
	for _, tenant := range authTenants {
		sets = append(sets, "config.tenants."+tenant+".profiles={csv-analyst}")
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	start := time.Now()
	r.install(t, vals)
	workers := readyWorkers(t, r.ns, 2)
	record("helm install with NATS auth (setup hook included) → workers ready: %s", time.Since(start).Round(time.Millisecond))
	checkSetupHookGone(t, r.ns)
	checkWorkersOnlyBind(t, r.ns, workers)

	// Each tenant's job, submitted with the tenant's own credentials.
	js := operatorJetStream(t, r, ids)
	for _, tenant := range authTenants {
		sub := r.sub.with("NATS_CREDS="+ids.creds[tenant+"-submitter"], "BOXCAR_TENANT="+tenant)
		id := sub.job(t, true)
		stmt := checkTenantRun(t, r.bucket, sub, r.keyDir, tenant, id, r.version, workers)
		if got := stmt.Predicate.Tenant.Name; got != tenant {
			t.Errorf("job %s of %s: the manifest records tenant %q", id, tenant, got)
		}
		if !hasStatus(t, js, tenant, id) {
			t.Errorf("job %s of %s: no status under %s.%s; checkNotTaken would not see one either", id, tenant, tenant, id)
		}
	}

	// Refused: no credentials at all, team-b's credentials acting for team-a, and team-a's
	// approver submitting. Each tries a job id of its own, which then is neither in the job
	// stream nor has a status: the server took nothing. Each goes through a port-forward of its
	// own: a connection NATS closes on a failed login ends the whole forward (client-go), which
	// must not take the operator's connection and the later steps' with it.
	refused := []struct {
		what string
		sub  *submitter
	}{
		{"no credentials", r.sub.with("BOXCAR_TENANT=team-a")},
		{"team-b's submitter for team-a", r.sub.with("NATS_CREDS="+ids.creds["team-b-submitter"], "BOXCAR_TENANT=team-a")},
		{"team-a's approver submitting a job", r.sub.with("NATS_CREDS="+ids.creds["team-a-approver"], "BOXCAR_TENANT=team-a")},
	}
	for i, tt := range refused {
		id := fmt.Sprintf("refused-%d-%s", i, strings.ToLower(rand.Text()[:8]))
		sub := tt.sub.with("NATS_URL=nats://" + forwardTo(t, "nats", "app.kubernetes.io/name=nats", 4222))
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		stdout, stderr, err := sub.run(rctx, "run", "--id", id, "--profile", "csv-analyst", "--task", "Summarise sales.csv", "--input", "examples/sales.csv", "--output", "json")
		cancel()
		if err == nil {
			t.Errorf("%s: submit run succeeded, want it refused:\n%s", tt.what, stdout)
			continue
		}
		t.Logf("%s: refused: %s", tt.what, strings.TrimSpace(lastLine(stderr)))
		checkNotTaken(t, js, "team-a", id)
	}

	upgradeRerunsSetup(t, r, ids, vals)
	checkNoSeeds(t, r, ids)
	r.uninstall(t)
}

// upgradeRerunsSetup: `helm upgrade` with a tenant's max_concurrent changed runs the setup hook
// again before the workers roll, and the tenant's consumer takes the new bound (the workers'
// identity could not have changed it).
func upgradeRerunsSetup(t *testing.T, r *release, ids identities, vals map[string]any) {
	t.Helper()
	ctx := t.Context()
	const consumer = "boxcar-workers-team-b"
	before := maxAckPending(t, r, ids, consumer)
	if err := strvals.ParseInto("config.tenants.team-b.max_concurrent=1", vals); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	up := action.NewUpgrade(r.helm.cfg)
	up.Namespace = r.ns
	up.WaitStrategy, up.Timeout = helmkube.StatusWatcherStrategy, 5*time.Minute
	if _, err := up.RunWithContext(ctx, helmRelease, r.helm.chart, vals); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, workerState(ctx, r.ns))
	}
	readyWorkers(t, r.ns, 2)
	record("helm upgrade with NATS auth (setup hook included) → new workers ready: %s", time.Since(start).Round(time.Millisecond))
	checkSetupHookGone(t, r.ns)
	if after := maxAckPending(t, r, ids, consumer); after != 1 {
		t.Errorf("after the upgrade, consumer %s has max_ack_pending %d (before: %d), want 1: the pre-upgrade hook did not declare it", consumer, after, before)
	}
}

// operatorJetStream connects to NATS with the operator's credentials, through the
// port-forward the submitter uses.
func operatorJetStream(t *testing.T, r *release, ids identities) jetstream.JetStream {
	t.Helper()
	var url string
	for _, e := range r.sub.env {
		if v, ok := strings.CutPrefix(e, "NATS_URL="); ok {
			url = v
		}
	}
	nc, err := nats.Connect(url, nats.UserCredentials(ids.creds["operator"]))
	if err != nil {
		t.Fatalf("connect to NATS as the operator: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// maxAckPending reads a consumer of the job stream as the operator.
func maxAckPending(t *testing.T, r *release, ids identities, consumer string) int {
	t.Helper()
	// Each tenant's consumer is on its tenant's stream, BOXCAR_JOBS_<tenant>.
	c, err := operatorJetStream(t, r, ids).Consumer(t.Context(), "BOXCAR_JOBS_"+strings.TrimPrefix(consumer, "boxcar-workers-"), consumer)
	if err != nil {
		t.Fatalf("consumer %s: %v", consumer, err)
	}
	return c.CachedInfo().Config.MaxAckPending
}

// checkNotTaken: the server took no job id of tenant: no message on its subject in the job
// stream (queued) and no status (run).
func checkNotTaken(t *testing.T, js jetstream.JetStream, tenant, id string) {
	t.Helper()
	ctx := t.Context()
	stream, err := js.Stream(ctx, "BOXCAR_JOBS_"+tenant)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		stream, err = js.Stream(ctx, "BOXCAR_JOBS") // a tenant with no stream: none of its own took it
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, "boxcar.jobs."+tenant+"."+id); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("job %s of %s: in the job stream (%v), want no message", id, tenant, err)
	}
	if hasStatus(t, js, tenant, id) {
		t.Errorf("job %s of %s: has a status, want none", id, tenant)
	}
}

// hasStatus says whether a job of tenant has a status, read as the operator.
func hasStatus(t *testing.T, js jetstream.JetStream, tenant, id string) bool {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), "BOXCAR_STATUS_"+tenant) // the tenant's status bucket
	if err != nil {
		t.Fatal(err)
	}
	_, err = kv.Get(t.Context(), tenant+"."+id)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("status of %s of %s: %v", id, tenant, err)
	}
	return err == nil
}

// identities is what `worker nats-config` wrote: its folder, each identity's .creds file and
// the public key of the account BOXCAR.
type identities struct {
	dir, account string
	creds        map[string]string // by identity: worker, operator, <tenant>-submitter, <tenant>-approver
}

// generateIdentities runs the release's `worker nats-config` (bin/image/worker) for a worker
// config with the csv-analyst profile and these tenants.
func generateIdentities(t *testing.T, tenants []string) identities {
	t.Helper()
	bin, err := filepath.Abs("../../bin/image/worker")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := strings.NewReplacer("{{IMAGE}}", "busybox", "{{KUBECONFIG}}", "\"\"", "{{NAMESPACE}}", helmSandboxes).Replace(readFile(t, "testdata/worker.yaml.tmpl"))
	cfg += "tenants:\n"
	for _, tenant := range tenants {
		cfg += "  " + tenant + ": {profiles: [csv-analyst]}\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "boxcar.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "nats-auth")
	stdout, err := exec.CommandContext(t.Context(), bin, "nats-config", "--config", filepath.Join(dir, "boxcar.yaml"), "--out", out).CombinedOutput()
	if err != nil {
		t.Fatalf("worker nats-config: %v\n%s (make image builds bin/image/worker)", err, stdout)
	}
	ids := identities{dir: out, creds: map[string]string{}}
	for _, name := range append([]string{"worker", "operator"}, tenantIdentities(tenants)...) {
		ids.creds[name] = filepath.Join(out, "creds", name+".creds")
	}
	for line := range strings.Lines(string(stdout)) {
		if v, ok := strings.CutPrefix(line, "account BOXCAR: "); ok {
			ids.account = strings.TrimSpace(v)
		}
	}
	if !strings.HasPrefix(ids.account, "A") {
		t.Fatalf("worker nats-config printed no account BOXCAR:\n%s", stdout)
	}
	return ids
}

func tenantIdentities(tenants []string) []string {
	var names []string
	for _, tenant := range tenants {
		names = append(names, tenant+"-submitter", tenant+"-approver")
	}
	return names
}

// seeds are the nkey seeds of every identity's .creds file: what must never leave them.
func (ids identities) seeds(t *testing.T) map[string]string {
	t.Helper()
	seeds := map[string]string{}
	for name, path := range ids.creds {
		for line := range strings.Lines(readFile(t, path)) {
			if line = strings.TrimSpace(line); strings.HasPrefix(line, "SU") && len(line) > 50 {
				seeds[name] = line
			}
		}
		if seeds[name] == "" {
			t.Fatalf("%s holds no user seed", path)
		}
	}
	return seeds
}

// refuseSandboxNamespace: `helm install` with the sandbox namespace the release's own fails
// with a message that names the value, and makes nothing.
func refuseSandboxNamespace(t *testing.T, r *release) {
	t.Helper()
	bad, err := common.ReadValues([]byte("sandboxes: {namespace: " + r.ns + ", createNamespace: false}"))
	if err != nil {
		t.Fatal(err)
	}
	vals := chartutil.MergeTables(bad, r.vals)
	in := action.NewInstall(r.helm.cfg)
	in.ReleaseName, in.Namespace = helmRelease, r.ns
	_, err = in.RunWithContext(t.Context(), r.helm.chart, vals)
	if err == nil || !strings.Contains(err.Error(), "sandboxes.namespace") || !strings.Contains(err.Error(), "release's own namespace") {
		t.Fatalf("helm install with sandboxes.namespace=%s (the release's): %v; want it refused, naming sandboxes.namespace", r.ns, err)
	}
	t.Logf("helm install with the sandbox namespace the release's: %v", err)
	if _, err := action.NewGet(r.helm.cfg).Run(helmRelease); err == nil {
		t.Fatal("the refused install left a release record")
	}
}

// checkSetupHookGone: the setup hook's Job ran and, having succeeded, was deleted.
func checkSetupHookGone(t *testing.T, ns string) {
	t.Helper()
	_, err := kube.Client.BatchV1().Jobs(ns).Get(t.Context(), helmRelease+"-setup", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the setup Job %s-setup is still there after a successful install (%v)", helmRelease, err)
	}
}

// checkWorkersOnlyBind: the workers' identity may not declare streams, so each worker bound to
// what the setup hook declared (it logs that once at start).
func checkWorkersOnlyBind(t *testing.T, ns string, workers map[string]bool) {
	t.Helper()
	for w := range workers {
		logs, err := kube.Client.CoreV1().Pods(ns).GetLogs(w, &corev1.PodLogOptions{}).DoRaw(t.Context())
		if err != nil {
			t.Fatalf("logs of %s: %v", w, err)
		}
		if !strings.Contains(string(logs), "may not declare") {
			t.Errorf("worker %s did not log that its identity only binds; did it run with worker.creds?\n%s", w, logs)
		}
	}
}

// checkNoSeeds: no identity's seed is in the release's rendered objects (hooks included), in a
// ConfigMap of the release's or NATS's namespace, or in a log of a worker or NATS; the scan
// finds them where they belong, in the Secrets.
func checkNoSeeds(t *testing.T, r *release, ids identities) {
	t.Helper()
	ctx := t.Context()
	seeds := ids.seeds(t)
	places := map[string]string{}
	rel, err := action.NewGet(r.helm.cfg).Run(helmRelease)
	if err != nil {
		t.Fatalf("helm get: %v", err)
	}
	rv, ok := rel.(*releasev1.Release)
	if !ok {
		t.Fatalf("helm get returned a %T", rel)
	}
	places["the release's manifest"] = rv.Manifest
	for _, h := range rv.Hooks {
		places["hook "+h.Name] = h.Manifest
	}
	for _, ns := range []string{r.ns, "nats"} {
		cms, err := kube.Client.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cm := range cms.Items {
			places["ConfigMap "+ns+"/"+cm.Name] = strings.Join(slices.Collect(maps.Values(cm.Data)), "\n")
		}
		pods, err := kube.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			for _, c := range p.Spec.Containers {
				logs, err := kube.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name}).DoRaw(ctx)
				if err != nil {
					t.Fatalf("logs of %s/%s: %v", p.Name, c.Name, err)
				}
				places["log of "+ns+"/"+p.Name+"/"+c.Name] = string(logs)
			}
		}
	}
	matches := 0
	for place, text := range places {
		for name, seed := range seeds {
			if strings.Contains(text, seed) {
				matches++
				t.Errorf("%s holds the seed of %s", place, name)
			}
		}
	}
	record("NATS auth: seeds of %d identities in %d rendered objects, ConfigMaps and logs: %d matches", len(seeds), len(places), matches)
	s, err := kube.Client.CoreV1().Secrets(r.ns).Get(ctx, "boxcar-nats-worker", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(s.Data["nats.creds"]), seeds["worker"]) {
		t.Fatal("the scan does not find the worker's seed in its own Secret")
	}
}

// with returns a copy of the submitter with more environment: a tenant, its credentials.
func (s *submitter) with(env ...string) *submitter {
	return &submitter{bin: s.bin, env: append(slices.Clone(s.env), env...)}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
