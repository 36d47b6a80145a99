package cluster_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	helmkube "helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/strvals"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/harness"
)

// What testdata/helm-values.yaml names: the release, its namespace, the sandboxes' namespace
// and the bucket.
const (
	helmRelease      = "boxcar"
	helmNamespace    = "boxcar"
	helmSandboxes    = "boxcar-sandboxes"
	helmBucket       = "boxcar"
	helmWorkerSelect = "app.kubernetes.io/name=boxcar,app.kubernetes.io/instance=" + helmRelease + ",app.kubernetes.io/component=worker"
	// annotationJobID is the annotation where the backend keeps a sandbox pod's whole job id.
	annotationJobID = "boxcar.run/job-id"
)

// TestHelmInstall installs deploy/helm/boxcar with the Helm v4 SDK as `helm install -f
// values.yaml` does, with the values a user writes (testdata/helm-values.yaml): the release
// image `make image` built, imported into the node's containerd; NATS as the official chart
// lays it out; versitygw and the scripted model in the release's namespace. The workers run as
// pods under the chart's ServiceAccount and Role and start every job's sandbox pod in the
// sandbox namespace the chart made, which enforces "restricted". Jobs are submitted from the
// host with the release's submit binary through port-forwards to NATS and versitygw; each
// succeeds, its signed manifest is in the bucket and `submit verify` passes. `helm upgrade`
// with a profile's memory changed gives the next job's sandbox pod the new limit, and `helm
// uninstall` leaves no worker and no sandbox pod.
func TestHelmInstall(t *testing.T) {
	ctx := t.Context()
	// The model's key is a marker: no worker log may hold it, nor the store's secret key.
	apiKey := "sk-helm-marker-" + rand.Text()
	r := setupRelease(t, apiKey)
	ns, sub, keyDir, bucket, version, sandboxes, h, vals, secretKey := r.ns, r.sub, r.keyDir, r.bucket, r.version, r.sandboxes, r.helm, r.vals, r.secretKey
	start := time.Now()
	r.install(t, vals)
	installed := time.Since(start)
	sb, err := kube.Client.CoreV1().Namespaces().Get(ctx, helmSandboxes, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := sb.Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		t.Errorf("namespace %s enforces %q, want restricted", helmSandboxes, got)
	}
	workers := readyWorkers(t, ns, 2)

	// One job as soon as the install is done, then three at once, which both workers share.
	first := sub.job(t, true)
	firstJob := time.Since(start)
	ids := []string{first}
	for range 3 {
		ids = append(ids, sub.job(t, false))
	}
	for _, id := range ids[1:] {
		sub.wait(t, id)
	}
	ran := map[string]bool{}
	for _, id := range ids {
		stmt := checkRun(t, bucket, sub, keyDir, id, version, workers)
		ran[stmt.Predicate.Worker.ID] = true
		if pod := sandboxes.forJob(t, id); pod.memory != "128Mi" || !workers[pod.worker] {
			t.Errorf("job %s's sandbox pod %s: memory limit %s, started by %q; want 128Mi, by a worker pod of the release", id, pod.name, pod.memory, pod.worker)
		}
	}
	if len(ran) != len(workers) {
		t.Errorf("the jobs ran on %v; want every worker pod of the release (%v)", slices.Sorted(maps.Keys(ran)), slices.Sorted(maps.Keys(workers)))
	}
	record("helm install → workers ready: %s", installed.Round(time.Millisecond))
	record("helm install → first job committed: %s", firstJob.Round(time.Millisecond))

	// helm upgrade --set …sandbox.memory=192Mi,…warm.min=1: new workers, the new limit on the
	// next job, and a warm pod kept by each worker, which the uninstall must not leave behind.
	if err := strvals.ParseInto("config.profiles.csv-analyst.sandbox.memory=192Mi,config.profiles.csv-analyst.warm.min=1", vals); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	up := action.NewUpgrade(h.cfg)
	up.Namespace = ns
	up.WaitStrategy, up.Timeout = helmkube.StatusWatcherStrategy, 5*time.Minute
	if _, err := up.RunWithContext(ctx, helmRelease, h.chart, vals); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, workerState(ctx, ns))
	}
	upgraded := readyWorkers(t, ns, 2)
	for w := range upgraded {
		if workers[w] {
			t.Errorf("worker pod %s outlived the upgrade; the changed config should roll every worker", w)
		}
	}
	record("helm upgrade → new workers ready: %s", time.Since(start).Round(time.Millisecond))
	// Each worker keeps a warm pod: the next job takes one, whichever worker runs it.
	harness.Wait(t, "a warm pool pod of csv-analyst from each worker", func() (bool, error) {
		pods, err := poolPods(ctx, "csv-analyst")
		if err != nil {
			return false, err
		}
		warm := map[string]bool{}
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && upgraded[p.Labels[sandbox.LabelWorker]] {
				warm[p.Labels[sandbox.LabelWorker]] = true
			}
		}
		return len(warm) == len(upgraded), nil
	}, harness.Within(3*time.Minute))
	id := sub.job(t, true)
	if stmt := checkRun(t, bucket, sub, keyDir, id, version, upgraded); !stmt.Predicate.Sandbox.Warm {
		t.Errorf("job %s started cold while every worker kept a warm pod; its manifest's sandbox: %+v", id, stmt.Predicate.Sandbox)
	}
	if pod := sandboxes.forJob(t, id); pod.memory != "192Mi" {
		t.Errorf("after the upgrade, job %s's sandbox pod %s has memory limit %s, want 192Mi", id, pod.name, pod.memory)
	}

	// Nothing a worker logged holds a secret it was given.
	for w := range upgraded {
		logs, err := kube.Client.CoreV1().Pods(ns).GetLogs(w, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("logs of %s: %v", w, err)
		}
		for what, secret := range map[string]string{"OPENAI_API_KEY": apiKey, "AWS_SECRET_ACCESS_KEY": secretKey} {
			if bytes.Contains(logs, []byte(secret)) {
				t.Errorf("worker %s's log holds the %s it was given", w, what)
			}
		}
	}

	// The job's claim took a pool pod: the pool makes another, which the uninstall must remove.
	harness.Wait(t, "a warm pool pod of csv-analyst", func() (bool, error) {
		pods, err := poolPods(ctx, "csv-analyst")
		return err == nil && len(pods) > 0, err
	}, harness.Within(3*time.Minute))

	// helm uninstall: no worker pod and no sandbox pod, warm pool pods included, are left. The
	// workers cannot remove them (their ServiceAccount and Role go with them): the garbage
	// collector does, as the pods' owner goes too.
	start = time.Now()
	r.uninstall(t)
	harness.Wait(t, "no warm pool pod left", func() (bool, error) {
		pods, err := poolPods(ctx, "")
		if err != nil {
			return false, err
		}
		if len(pods) > 0 {
			return false, fmt.Errorf("%d pool pods left, first %s", len(pods), pods[0].Name)
		}
		return true, nil
	}, harness.Within(3*time.Minute))
	harness.Wait(t, "no worker pod left", func() (bool, error) {
		pods, err := kube.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: helmWorkerSelect})
		if err != nil {
			return false, err
		}
		if len(pods.Items) > 0 {
			return false, fmt.Errorf("%d worker pods left, first %s", len(pods.Items), pods.Items[0].Name)
		}
		return true, nil
	}, harness.Within(3*time.Minute))
	noSandboxLeft(t, helmSandboxes)
	record("helm uninstall → no worker or sandbox pod: %s", time.Since(start).Round(time.Millisecond))
}

// poolPods lists the warm pool pods in the release's sandbox namespace: the profile's, or with
// "" every profile's.
func poolPods(ctx context.Context, profile string) ([]corev1.Pod, error) {
	sel := sandbox.LabelPool
	if profile != "" {
		sel += "=" + profile
	}
	pods, err := kube.Client.CoreV1().Pods(helmSandboxes).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// release is what TestHelmInstall and TestKEDAScale set up before `helm install`: the release
// image on the node, NATS, the store and the model in the test namespace, the API key and
// signing key Secrets, a bucket, a submitter that reaches NATS and the store through
// port-forwards, the sandbox pods watched, and the chart's values for the image.
type release struct {
	ns, version, keyDir  string
	accessKey, secretKey string
	sub                  *submitter
	bucket               *s3.Client
	sandboxes            *sandboxWatch
	helm                 *helmClient
	vals                 map[string]any
}

func setupRelease(t *testing.T, apiKey string) *release {
	t.Helper()
	return setupReleaseWith(t, apiKey, "")
}

// setupReleaseWith is setupRelease with NATS's auth.conf (installNATSWith).
func setupReleaseWith(t *testing.T, apiKey, natsAuth string) *release {
	t.Helper()
	image, version := importReleaseImage(t)
	i := strings.LastIndex(image, ":")
	if i < 0 {
		t.Fatalf("bin/image.ref names %q, want REPOSITORY:TAG; rebuild it: make image", image)
	}
	installNATSWith(t, natsAuth)
	r := &release{ns: testNamespaceNamed(t, helmNamespace), version: version, keyDir: filepath.Join(t.TempDir(), "keys")}
	r.accessKey, r.secretKey = installStoreAndModel(t, r.ns)
	r.sub = newSubmitter(t)
	r.sub.mustRun(t, "keygen", "--out", r.keyDir)
	createSecret(t, r.ns, "boxcar-openai", map[string][]byte{"api-key": []byte(apiKey)})
	createSecret(t, r.ns, "boxcar-signing", map[string][]byte{"signing.key": []byte(readFile(t, filepath.Join(r.keyDir, "signing.key")))})
	// The chart makes the sandboxes' namespace and keeps it when the release goes
	// (helm.sh/resource-policy: keep), as it keeps any sandbox pod left in it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := kube.Client.CoreV1().Namespaces().Delete(ctx, helmSandboxes, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", helmSandboxes, err)
		}
	})
	// What a user's laptop sees: NATS and the store through port-forwards on 127.0.0.1.
	natsAddr := forwardTo(t, "nats", "app.kubernetes.io/name=nats", 4222)
	s3Addr := forwardTo(t, r.ns, "app.kubernetes.io/name=versitygw", 7070)
	r.bucket = s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String("http://" + s3Addr), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(r.accessKey, r.secretKey, ""),
	})
	if _, err := r.bucket.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String(helmBucket)}); err != nil {
		t.Fatalf("create bucket %s: %v", helmBucket, err)
	}
	r.sub.env = append(r.sub.env, "NATS_URL=nats://"+natsAddr, "BOXCAR_STORE=s3://"+helmBucket,
		"BOXCAR_S3_ENDPOINT=http://"+s3Addr, "AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID="+r.accessKey, "AWS_SECRET_ACCESS_KEY="+r.secretKey)
	r.sandboxes = watchSandboxPods(t, helmSandboxes)
	r.helm = newHelm(t, r.ns)
	r.vals = helmValues(t, image[:i], image[i+1:])
	return r
}

// install is `helm install` of the release with vals, waiting for its resources; the worker
// pods' state is logged when the test fails.
func (r *release) install(t *testing.T, vals map[string]any) {
	t.Helper()
	in := action.NewInstall(r.helm.cfg)
	in.ReleaseName, in.Namespace = helmRelease, r.ns
	in.WaitStrategy, in.Timeout = helmkube.StatusWatcherStrategy, 5*time.Minute
	if _, err := in.RunWithContext(t.Context(), r.helm.chart, vals); err != nil {
		t.Fatalf("helm install: %v\n%s", err, workerState(t.Context(), r.ns))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker pods:\n%s", workerState(context.WithoutCancel(t.Context()), r.ns))
		}
	})
}

// uninstall is `helm uninstall`, waiting for the release's resources to go.
func (r *release) uninstall(t *testing.T) {
	t.Helper()
	un := action.NewUninstall(r.helm.cfg)
	un.WaitStrategy, un.Timeout = helmkube.StatusWatcherStrategy, 3*time.Minute
	if _, err := un.Run(helmRelease); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
}

// importReleaseImage imports the release image `make image` built (bin/image.tar, named in
// bin/image.ref) into the node's containerd, and returns its name and version.
func importReleaseImage(t testing.TB) (image, version string) {
	t.Helper()
	ref, err := os.ReadFile("../../bin/image.ref")
	if err != nil {
		t.Fatalf("no release image (%v); build it first, from the repository's root: make image", err)
	}
	f := strings.Fields(string(ref))
	if len(f) != 2 {
		t.Fatalf("bin/image.ref holds %q, want \"IMAGE VERSION\"; rebuild it: make image", ref)
	}
	if err := kube.ImportArchive(t.Context(), "../../bin/image.tar"); err != nil {
		t.Fatalf("%v (make image writes bin/image.tar)", err)
	}
	return f[0], f[1]
}

// helmValues reads testdata/helm-values.yaml as `helm install -f` does, with the image filled
// in, and adds testdata/worker.yaml.tmpl's profile csv-analyst, the one the scripted model
// plays, with its sandbox image the node's.
func helmValues(t *testing.T, repo, tag string) map[string]any {
	t.Helper()
	text := strings.NewReplacer("{{IMAGE_REPOSITORY}}", repo, "{{IMAGE_TAG}}", tag).Replace(readFile(t, "testdata/helm-values.yaml"))
	vals, err := common.ReadValues([]byte(text))
	if err != nil {
		t.Fatalf("testdata/helm-values.yaml: %v", err)
	}
	worker, err := common.ReadValues([]byte(strings.NewReplacer("{{IMAGE}}", cluster.SandboxImage, "{{KUBECONFIG}}", "", "{{NAMESPACE}}", helmSandboxes).
		Replace(readFile(t, "testdata/worker.yaml.tmpl"))))
	if err != nil {
		t.Fatalf("testdata/worker.yaml.tmpl: %v", err)
	}
	profile, err := worker.Table("profiles.csv-analyst")
	if err != nil {
		t.Fatalf("testdata/worker.yaml.tmpl: %v", err)
	}
	profiles, err := vals.Table("config.profiles")
	if err != nil {
		t.Fatalf("testdata/helm-values.yaml: %v", err)
	}
	profiles["csv-analyst"] = map[string]any(profile)
	return vals
}

// helmClient is what the helm command holds: an action configuration on the cluster's
// kubeconfig (release records in Secrets, as the CLI keeps them) and the chart.
type helmClient struct {
	cfg   *action.Configuration
	chart *chart.Chart
}

func newHelm(t *testing.T, ns string) *helmClient {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	kubeconfig := kube.Kubeconfig
	flags.KubeConfig, flags.Namespace = &kubeconfig, &ns
	cfg := action.NewConfiguration()
	cfg.SetLogger(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := cfg.Init(flags, ns, "secret"); err != nil {
		t.Fatalf("helm: %v", err)
	}
	ch, err := loader.Load("../../deploy/helm/boxcar")
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	return &helmClient{cfg: cfg, chart: ch}
}

// testWriter sends Helm's warnings to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// readyWorkers waits until the release runs exactly n worker pods, all Ready and none
// terminating, checks they run under the chart's ServiceAccount, and returns their names.
func readyWorkers(t *testing.T, ns string, n int) map[string]bool {
	t.Helper()
	ctx := t.Context()
	var names map[string]bool
	harness.Wait(t, fmt.Sprintf("%d ready worker pods", n), func() (bool, error) {
		pods, err := kube.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: helmWorkerSelect})
		if err != nil {
			return false, err
		}
		names = map[string]bool{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || !podReady(p) {
				return false, fmt.Errorf("pod %s: phase %s, deleting %v, ready %v", p.Name, p.Status.Phase, p.DeletionTimestamp != nil, podReady(p))
			}
			if p.Spec.ServiceAccountName != helmRelease {
				t.Fatalf("worker pod %s runs as ServiceAccount %q, want the chart's %q", p.Name, p.Spec.ServiceAccountName, helmRelease)
			}
			names[p.Name] = true
		}
		if len(names) != n {
			return false, fmt.Errorf("%d worker pods, want %d", len(names), n)
		}
		return true, nil
	}, harness.Within(3*time.Minute))
	return names
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// workerState describes the release's worker pods and the end of their logs, for a failure.
func workerState(ctx context.Context, ns string) string {
	pods, err := kube.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: helmWorkerSelect})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: phase %s, ready %v, containers %+v\n", p.Name, p.Status.Phase, podReady(p), p.Status.ContainerStatuses)
		tail := int64(30)
		logs, err := kube.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
		if err != nil {
			fmt.Fprintf(&b, "  logs: %v\n", err)
			continue
		}
		fmt.Fprintf(&b, "%s\n", logs)
	}
	return b.String()
}

func createSecret(t *testing.T, ns, name string, data map[string][]byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}
	if _, err := kube.Client.CoreV1().Secrets(ns).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Secret %s: %v", name, err)
	}
}

// forwardTo port-forwards 127.0.0.1:<free port> to port of the running pod that selector picks
// in ns, as `kubectl port-forward svc/…` does, and returns the local address.
func forwardTo(t *testing.T, ns, selector string, port int) string {
	t.Helper()
	ctx := t.Context()
	pods, err := kube.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector, FieldSelector: "status.phase=Running"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatalf("no running pod in %s matches %s", ns, selector)
	}
	addr, err := kube.PortForward(ctx, ns, pods.Items[0].Name, port)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// submitter runs the release's submit binary (bin/image/submit, what `make image` put in the
// image) on the host, with an environment of its own.
type submitter struct {
	bin string
	env []string
}

func newSubmitter(t *testing.T) *submitter {
	t.Helper()
	bin, err := filepath.Abs("../../bin/image/submit")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no submit binary (%v); build it first, from the repository's root: make image", err)
	}
	home := t.TempDir()
	return &submitter{bin: bin, env: []string{"PATH=/usr/bin:/bin", "HOME=" + home, "BOXCAR_HOME=" + filepath.Join(home, ".boxcar")}}
}

// run runs submit with args and returns its stdout, stderr and exit error.
func (s *submitter) run(ctx context.Context, args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, s.bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr, cmd.Dir = s.env, &stdout, &stderr, "../.."
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func (s *submitter) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	stdout, stderr, err := s.run(ctx, args...)
	if err != nil {
		t.Fatalf("submit %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout
}

// job submits the csv-analyst job on examples/sales.csv and returns its id; with wait, it
// follows the job and checks that it succeeded.
func (s *submitter) job(t *testing.T, wait bool) string {
	t.Helper()
	args := []string{"run", "--profile", "csv-analyst", "--task", "Summarise sales.csv", "--input", "examples/sales.csv", "--output", "json"}
	if wait {
		args = append(args, "--wait", "--timeout", "3m")
	}
	res := lastJSON(t, s.mustRun(t, args...))
	if wait && res.State != "succeeded" {
		t.Fatalf("job %s: state %q, want succeeded", res.ID, res.State)
	}
	return res.ID
}

// wait follows a submitted job until it ends and checks that it succeeded.
func (s *submitter) wait(t *testing.T, id string) {
	t.Helper()
	if res := lastJSON(t, s.mustRun(t, "watch", id, "--timeout", "3m", "--output", "json")); res.State != "succeeded" {
		t.Fatalf("job %s: state %q, want succeeded", id, res.State)
	}
}

type jobResult struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// lastJSON parses the last line of submit's --output json.
func lastJSON(t *testing.T, stdout string) jobResult {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var res jobResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || res.ID == "" {
		t.Fatalf("the last line of submit's stdout is not a job's JSON (%v):\n%s", err, stdout)
	}
	return res
}

// checkRun reads the job's manifest from the bucket, checks it names the Kubernetes backend,
// the sandbox image and its digest, a worker pod of the release and the image's version, and
// that the report holds the figure the tool computed in the sandbox pod, then runs `submit
// verify` with the signer's public key. It returns the manifest.
func checkRun(t *testing.T, bucket *s3.Client, sub *submitter, keyDir, id, version string, workers map[string]bool) provenance.Statement {
	t.Helper()
	return checkTenantRun(t, bucket, sub, keyDir, "default", id, version, workers)
}

// checkTenantRun is checkRun for a job of tenant, whose objects are under tenants/<tenant>/.
func checkTenantRun(t *testing.T, bucket *s3.Client, sub *submitter, keyDir, tenant, id, version string, workers map[string]bool) provenance.Statement {
	t.Helper()
	stmt, err := provenance.Parse(getObject(t, bucket, "tenants/"+tenant+"/runs/"+id+"/manifest.json"))
	if err != nil {
		t.Fatalf("job %s: parse manifest: %v", id, err)
	}
	p := stmt.Predicate
	if p.Sandbox.Backend != "kubernetes" || p.Sandbox.Image != cluster.SandboxImage || !strings.HasPrefix(p.Sandbox.ImageDigest, "sha256:") {
		t.Errorf("job %s: manifest sandbox = %+v, want backend kubernetes, image %s and its digest", id, p.Sandbox, cluster.SandboxImage)
	}
	if !workers[p.Worker.ID] || p.Worker.Version != version {
		t.Errorf("job %s: manifest worker = %+v, want a worker pod of the release (%v) at version %s", id, p.Worker, slices.Sorted(maps.Keys(workers)), version)
	}
	var report []byte
	for _, s := range stmt.Subjects {
		if s.Name == "report.md" {
			report = getObject(t, bucket, "tenants/"+tenant+"/"+provenance.SubjectKey(id, s))
		}
	}
	// 92 units over 12 rows of examples/sales.csv, summed by busybox awk in the sandbox pod.
	if !bytes.Contains(report, []byte("| units | 12 | 92.00 |")) {
		t.Errorf("job %s: the report lacks the units figure the tool computed in the pod:\n%s", id, report)
	}
	sub.mustRun(t, "verify", id, "--public-key", filepath.Join(keyDir, "signing.pub"), "--require-signature")
	return stmt
}

func getObject(t *testing.T, bucket *s3.Client, key string) []byte {
	t.Helper()
	out, err := bucket.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(helmBucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get s3://%s/%s: %v", helmBucket, key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("get s3://%s/%s: %v", helmBucket, key, err)
	}
	return data
}

// sandboxPod is what a sandbox pod looked like when it was created.
type sandboxPod struct {
	name, job, worker, memory string
}

// sandboxWatch records every sandbox pod created in a namespace while the test runs: the
// backend deletes a job's pod as the job ends, before the test could look at it.
type sandboxWatch struct {
	mu   sync.Mutex
	pods map[string]sandboxPod // by pod name
}

func watchSandboxPods(t *testing.T, ns string) *sandboxWatch {
	t.Helper()
	ctx := t.Context()
	w := &sandboxWatch{pods: map[string]sandboxPod{}}
	sel := labels.SelectorFromSet(labels.Set{sandbox.LabelManagedBy: "boxcar", sandbox.LabelComponent: "sandbox"}).String()
	go func() {
		// A watch ends now and then (the API server's timeout); start it again until the test ends.
		for ctx.Err() == nil {
			wi, err := kube.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				time.Sleep(time.Second)
				continue
			}
			for ev := range wi.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || len(p.Spec.Containers) == 0 {
					continue
				}
				w.mu.Lock()
				w.pods[p.Name] = sandboxPod{name: p.Name, job: p.Annotations[annotationJobID], worker: p.Labels[sandbox.LabelWorker],
					memory: p.Spec.Containers[0].Resources.Limits.Memory().String()}
				w.mu.Unlock()
			}
			wi.Stop()
		}
	}()
	return w
}

// forJob returns the sandbox pod of a job, which must have had exactly one.
func (w *sandboxWatch) forJob(t *testing.T, id string) sandboxPod {
	t.Helper()
	found := w.allForJob(t, id)
	if len(found) != 1 {
		t.Errorf("job %s had %d sandbox pods, want 1: %+v", id, len(found), found)
	}
	return found[0]
}
