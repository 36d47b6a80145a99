package cluster_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/common"
	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/harness"
)

// kedaJobs is how many jobs TestKEDAScale submits at once to the scaled-to-zero release.
const kedaJobs = 40

var scaledObjects = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}

// TestKEDAScale installs the chart with keda.enabled (testdata/helm-values-keda.yaml on top of
// testdata/helm-values.yaml, as a user adds a values file) on a cluster that has KEDA's CRDs, so
// the release holds a real ScaledObject, and scales the release with keda-standin: KEDA's
// nats-jetstream scaler, fallback and scale executor (built from KEDA's module by build.sh),
// reading the ScaledObject and the consumer's lag through a port-forward to NATS monitoring on
// the headless Service, with a stand-in for the HPA (no external metrics API runs here). The
// release starts at one worker, which sets up the stream and the consumer, and KEDA scales it to
// zero; 40 jobs submitted from the host then raise the replicas, every job commits, and after
// the cooldown the replicas are back at zero with no worker or sandbox pod left. Then, with the
// monitoring endpoint unreachable, KEDA's fallback runs fallback.replicas workers.
func TestKEDAScale(t *testing.T) {
	standin, crdDir := kedaStandin(t)
	installKEDACRDs(t, crdDir)
	r := setupRelease(t, "sk-keda-test")
	ns, sub, keyDir, bucket, version, sandboxes := r.ns, r.sub, r.keyDir, r.bucket, r.version, r.sandboxes
	// KEDA's endpoint, nats-headless.nats.svc.cluster.local:8222, resolves in pods only: the
	// stand-in on the host reads the same port of the same pod through a port-forward.
	monitorAddr := forwardTo(t, "nats", "app.kubernetes.io/name=nats", 8222)
	overlay, err := common.ReadValues([]byte(readFile(t, "testdata/helm-values-keda.yaml")))
	if err != nil {
		t.Fatalf("testdata/helm-values-keda.yaml: %v", err)
	}
	mergeValues(r.vals, overlay)
	r.install(t, r.vals)
	so := scaledObject(t, ns)
	spec, _ := so.Object["spec"].(map[string]any)
	t.Logf("the chart's ScaledObject: %s", mustJSON(spec))
	minReplicas, _, _ := unstructured.NestedInt64(so.Object, "spec", "minReplicaCount")
	fallbackReplicas, _, _ := unstructured.NestedInt64(so.Object, "spec", "fallback", "replicas")
	if minReplicas != 0 || fallbackReplicas == 0 {
		t.Fatalf("ScaledObject spec has minReplicaCount %d, fallback.replicas %d; testdata/helm-values-keda.yaml asks for 0 and a fallback", minReplicas, fallbackReplicas)
	}

	deploy := watchDeployment(t, ns, helmRelease)
	load := readLoad()
	run := startStandin(t, standin, monitorAddr)
	// The Deployment had no replicas field (KEDA owns it) and started at one worker, which made
	// the stream and the consumer; KEDA, seeing no lag, scales it to minReplicaCount at once.
	deploy.waitFor(t, 3*time.Minute, "the release scaled to zero", func(s deployState) bool { return s.spec == 0 && s.pods == 0 })

	// 40 jobs from the host in one `submit run --jobs`; --wait follows them to the end.
	var lines strings.Builder
	for n := range kedaJobs {
		fmt.Fprintf(&lines, `{"profile":"csv-analyst","task":"Summarise sales.csv (%d)","inputs":["examples/sales.csv"]}`+"\n", n)
	}
	jobsFile := filepath.Join(t.TempDir(), "jobs.jsonl")
	if err := os.WriteFile(jobsFile, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	submitted, results := submitJobs(t, sub, jobsFile)
	drained := time.Since(submitted)
	for _, r := range results {
		if r.State != "succeeded" {
			t.Errorf("job %s (line %d): %s, want succeeded", r.ID, r.Line, r.State)
		}
	}
	if len(results) != kedaJobs {
		t.Fatalf("submit reported %d final statuses, want %d", len(results), kedaJobs)
	}
	// Every job ran its tool in a sandbox pod that a worker pod of the release started; a few
	// runs are checked whole (manifest, report, signature). A job may have run twice (delivery
	// is at least once: a worker removed by a scale-down hands back what it cannot finish within
	// its drain grace) and still commit once; the figures count those.
	workers := deploy.workers()
	ran, again := map[string]bool{}, 0
	for i, r := range results {
		pods := sandboxes.allForJob(t, r.ID)
		if len(pods) > 1 {
			again++
			t.Logf("job %s ran %d times: %+v", r.ID, len(pods), pods)
		}
		for _, pod := range pods {
			if !workers[pod.worker] {
				t.Errorf("job %s's sandbox pod %s was started by %q, not a worker pod of the release", r.ID, pod.name, pod.worker)
			}
			ran[pod.worker] = true
		}
		if i < 3 {
			checkRun(t, bucket, sub, keyDir, r.ID, version, workers)
		}
	}
	back := deploy.waitFor(t, 5*time.Minute, "the release back at zero replicas with no worker pod", func(s deployState) bool {
		return s.spec == 0 && s.pods == 0
	})
	noSandboxLeft(t, helmSandboxes)

	firstReady, peak, peakReady := deploy.after(submitted)
	if peak.spec < 1 || firstReady.IsZero() {
		t.Errorf("the replicas never rose above zero after %d jobs were submitted (peak %d, %d ready)", kedaJobs, peak.spec, peakReady)
	}
	if peak.spec < 2 {
		t.Errorf("peak of %d replicas for %d waiting jobs with lagThreshold 1; KEDA's metric should have asked the HPA for maxReplicaCount", peak.spec, kedaJobs)
	}
	steps := run.stop(t)
	so = scaledObject(t, ns)
	lastActive, _, _ := unstructured.NestedString(so.Object, "status", "lastActiveTime")
	if lastActive == "" {
		t.Errorf("the ScaledObject's status has no lastActiveTime; KEDA's executor records it when it activates: %s", mustJSON(so.Object["status"]))
	}
	summary := fmt.Sprintf("KEDA scale (%d jobs, keda-standin): submitted → first new worker ready %s; peak %d replicas (%d ready; %d worker pods ran jobs); drained (every job final) in %s, %d jobs run twice; back to minimum (0) %s after the drain, %s after submitting; %d stand-in steps; load average %s at start, %s at end",
		kedaJobs, since(submitted, firstReady), peak.spec, peakReady, len(ran), drained.Round(time.Millisecond), again,
		back.Sub(submitted.Add(drained)).Round(time.Millisecond), back.Sub(submitted).Round(time.Millisecond), steps, load, readLoad())
	t.Log(summary)
	record("%s", summary)

	// The fallback: the monitoring endpoint refuses connections, so every read fails; past
	// failureThreshold, KEDA's fallback answers fallback.replicas × the target and the release
	// runs that many workers although it sat at zero.
	start := time.Now()
	run = startStandin(t, standin, testnet.ClosedAddr(t))
	deploy.waitFor(t, 3*time.Minute, fmt.Sprintf("fallback.replicas (%d) ready workers while the scaler fails", fallbackReplicas), func(s deployState) bool {
		return s.spec == int32(fallbackReplicas) && s.ready == int32(fallbackReplicas)
	})
	fallbackUp := time.Since(start)
	run.stop(t)
	so = scaledObject(t, ns)
	if c := condition(so, "Fallback"); c["status"] != "True" {
		t.Errorf("the ScaledObject's Fallback condition is %v, want True (KEDA's fallback sets it): %s", c, mustJSON(so.Object["status"]))
	}
	record("KEDA fallback: monitoring unreachable → %d workers ready in %s", fallbackReplicas, fallbackUp.Round(time.Millisecond))

	r.uninstall(t)
	deploy.waitFor(t, 3*time.Minute, "no worker pod after helm uninstall", func(s deployState) bool { return s.pods == 0 })
	noSandboxLeft(t, helmSandboxes)
}

// allForJob returns every sandbox pod of a job, waiting for the first.
func (w *sandboxWatch) allForJob(t *testing.T, id string) []sandboxPod {
	t.Helper()
	var found []sandboxPod
	harness.Wait(t, "the sandbox pod of job "+id, func() (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		found = nil
		for _, p := range w.pods {
			if p.job == id {
				found = append(found, p)
			}
		}
		if len(found) == 0 {
			return false, errors.New("none seen")
		}
		return true, nil
	}, harness.Within(30*time.Second))
	return found
}

// kedaStandin returns build.sh's keda-standin binary and the folder of KEDA's CRDs beside it,
// for the KEDA version test/cluster/keda/go.mod names.
func kedaStandin(t *testing.T) (bin, crds string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/kedacore/keda/v2 (v\S+)$`).FindStringSubmatch(readFile(t, "keda/go.mod"))
	if m == nil {
		t.Fatal("keda/go.mod names no github.com/kedacore/keda/v2 version")
	}
	dir := filepath.Join(cluster.CacheDir(), "keda-"+m[1])
	bin, crds = filepath.Join(dir, "bin", "keda-standin"), filepath.Join(dir, "crd")
	for _, p := range []string{bin, filepath.Join(crds, "keda.sh_scaledobjects.yaml")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v; run test/cluster/build.sh", err)
		}
	}
	return bin, crds
}

// installKEDACRDs creates KEDA's CRDs, as KEDA's install does, and waits until the API serves
// them; they go when the test ends, with any object of theirs.
func installKEDACRDs(t *testing.T, dir string) {
	t.Helper()
	ctx := t.Context()
	ext, err := apiextensions.NewForConfig(kube.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s (%v); run test/cluster/build.sh", dir, err)
	}
	for _, f := range files {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict([]byte(readFile(t, f)), crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CRD %s: %v", crd.Name, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := ext.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, crd.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete CRD %s: %v", crd.Name, err)
			}
		})
		harness.Wait(t, "CRD "+crd.Name+" established", func() (bool, error) {
			got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, fmt.Errorf("conditions %+v", got.Status.Conditions)
		})
	}
}

// mergeValues merges overlay into vals as a second `helm install -f` file does: maps merge,
// anything else in overlay replaces.
func mergeValues(vals, overlay map[string]any) {
	for k, v := range overlay {
		if om, ok := v.(map[string]any); ok {
			if vm, ok := vals[k].(map[string]any); ok {
				mergeValues(vm, om)
				continue
			}
		}
		vals[k] = v
	}
}

func scaledObject(t *testing.T, ns string) *unstructured.Unstructured {
	t.Helper()
	dc, err := dynamic.NewForConfig(kube.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	so, err := dc.Resource(scaledObjects).Namespace(ns).Get(t.Context(), helmRelease, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the release's ScaledObject: %v", err)
	}
	return so
}

func condition(so *unstructured.Unstructured, typ string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(so.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// readLoad is the 1-minute load average, for the figures.
func readLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func since(from, to time.Time) string {
	if to.IsZero() {
		return "never"
	}
	return to.Sub(from).Round(time.Millisecond).String()
}

// standinRun is a running keda-standin; its step lines go to the test's log.
type standinRun struct {
	cmd   *exec.Cmd
	done  chan struct{}
	steps int
}

func startStandin(t *testing.T, bin, endpoint string) *standinRun {
	t.Helper()
	cmd := exec.Command(bin, "--kubeconfig", kube.Kubeconfig, "--namespace", helmNamespace, "--scaledobject", helmRelease, "--endpoint", endpoint)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(t.TempDir(), "keda-standin.stderr"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	r := &standinRun{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "step ") {
				r.steps++
			}
			t.Log(sc.Text())
		}
	}()
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			r.stop(t)
		}
		if t.Failed() {
			logs, _ := os.ReadFile(logFile.Name())
			t.Logf("keda-standin's stderr:\n%s", tail(string(logs), 60))
		}
	})
	return r
}

// stop ends the stand-in with SIGTERM and returns how many steps it printed.
func (r *standinRun) stop(t *testing.T) int {
	t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	if err := r.cmd.Wait(); err != nil && r.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("keda-standin: %v", err)
	}
	return r.steps
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

type jobLine struct {
	Line  int    `json:"line"`
	ID    string `json:"id"`
	State string `json:"state"`
}

// submitJobs runs `submit run --jobs FILE --wait` and returns when every job is final: the time
// the last job was queued, and each job's final status.
func submitJobs(t *testing.T, sub *submitter, file string) (time.Time, []jobLine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sub.bin, "run", "--jobs", file, "--wait", "--timeout", "14m")
	cmd.Env, cmd.Dir = sub.env, "../.."
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var submitted time.Time
	var final []jobLine
	queued := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var l jobLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Errorf("submit printed a line that is not JSON: %s", sc.Text())
			continue
		}
		if queued < kedaJobs {
			if l.State != "queued" {
				t.Errorf("submit: line %d: %s, want queued: %s", l.Line, l.State, sc.Text())
			}
			if queued++; queued == kedaJobs {
				submitted = time.Now()
			}
			continue
		}
		final = append(final, l)
	}
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("submit run --jobs --wait: %v\nstderr:\n%s", err, tail(stderr.String(), 20))
	}
	if submitted.IsZero() {
		t.Fatalf("submit queued %d of %d jobs:\n%s", queued, kedaJobs, stderr.String())
	}
	return submitted, final
}

// deployState is the release's Deployment at one moment: its replicas, the ready ones, and
// the worker pods that exist (terminating ones too).
type deployState struct {
	at          time.Time
	spec, ready int32
	pods        int
}

// deployWatch keeps every state of a Deployment and its pods while the test runs.
type deployWatch struct {
	ns, name string
	mu       sync.Mutex
	cur      deployState
	history  []deployState
	names    map[string]bool // every worker pod seen
	changed  chan struct{}
}

// watchDeployment follows the Deployment and its worker pods with watches until the test ends.
func watchDeployment(t *testing.T, ns, name string) *deployWatch {
	t.Helper()
	ctx := t.Context()
	w := &deployWatch{ns: ns, name: name, names: map[string]bool{}, changed: make(chan struct{}, 1)}
	pods := map[string]bool{}
	var mu sync.Mutex
	update := func(f func(*deployState)) {
		w.mu.Lock()
		f(&w.cur)
		w.cur.at = time.Now()
		w.history = append(w.history, w.cur)
		w.mu.Unlock()
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
	follow := func(watchFn func() (watch.Interface, error), handle func(watch.Event)) {
		for ctx.Err() == nil {
			wi, err := watchFn()
			if err != nil {
				time.Sleep(time.Second)
				continue
			}
			for ev := range wi.ResultChan() {
				handle(ev)
			}
			wi.Stop()
		}
	}
	go follow(func() (watch.Interface, error) {
		return kube.Client.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	}, func(ev watch.Event) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			return
		}
		update(func(s *deployState) {
			s.spec, s.ready = 1, d.Status.ReadyReplicas
			if d.Spec.Replicas != nil {
				s.spec = *d.Spec.Replicas
			}
			if ev.Type == watch.Deleted {
				s.spec, s.ready = 0, 0
			}
		})
	})
	go follow(func() (watch.Interface, error) {
		mu.Lock()
		clear(pods) // a new watch lists every pod again as Added
		mu.Unlock()
		return kube.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: helmWorkerSelect})
	}, func(ev watch.Event) {
		m, ok := ev.Object.(metav1.Object)
		if !ok {
			return
		}
		mu.Lock()
		if ev.Type == watch.Deleted {
			delete(pods, m.GetName())
		} else {
			pods[m.GetName()] = true
		}
		n := len(pods)
		mu.Unlock()
		w.mu.Lock()
		w.names[m.GetName()] = true
		w.mu.Unlock()
		update(func(s *deployState) { s.pods = n })
	})
	return w
}

// waitFor waits until the state satisfies cond, as the watches saw it and as the API says now
// (a watch may not have delivered its first events yet), and returns when the watches saw it.
func (w *deployWatch) waitFor(t *testing.T, timeout time.Duration, what string, cond func(deployState) bool) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		cur := w.cur
		w.mu.Unlock()
		if cond(cur) {
			if live, err := w.live(t.Context()); err == nil && cond(live) {
				return cur.at
			}
		}
		select {
		case <-w.changed:
		case <-time.After(time.Second):
		case <-deadline:
			t.Fatalf("%s: not after %s; the Deployment has %d replicas, %d ready, %d worker pods", what, timeout, cur.spec, cur.ready, cur.pods)
		}
	}
}

// live reads the Deployment and its worker pods from the API.
func (w *deployWatch) live(ctx context.Context) (deployState, error) {
	s := deployState{at: time.Now()}
	d, err := kube.Client.AppsV1().Deployments(w.ns).Get(ctx, w.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return s, err
	default:
		s.spec, s.ready = 1, d.Status.ReadyReplicas
		if d.Spec.Replicas != nil {
			s.spec = *d.Spec.Replicas
		}
	}
	pods, err := kube.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{LabelSelector: helmWorkerSelect})
	if err != nil {
		return s, err
	}
	s.pods = len(pods.Items)
	return s, nil
}

// workers returns the name of every worker pod the watch saw.
func (w *deployWatch) workers() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.names)
}

// after returns, from the states since t0, when a worker was first ready, the state with the
// most replicas, and the most ready workers.
func (w *deployWatch) after(t0 time.Time) (firstReady time.Time, peak deployState, peakReady int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.history {
		if s.at.Before(t0) {
			continue
		}
		if s.ready > 0 && firstReady.IsZero() {
			firstReady = s.at
		}
		if s.spec > peak.spec {
			peak = s
		}
		peakReady = max(peakReady, s.ready)
	}
	return firstReady, peak, peakReady
}
