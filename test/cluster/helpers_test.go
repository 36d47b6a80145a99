package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/submitcmd"
	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/harness"
)

// sandboxNamespace creates a namespace for sandbox pods that enforces the "restricted" Pod
// Security Standard, waits for its default ServiceAccount (admission needs it even for pods
// that mount no token), and deletes it when the test ends.
func sandboxNamespace(t *testing.T) string {
	t.Helper()
	return testNamespace(t, "sb-", map[string]string{
		"pod-security.kubernetes.io/enforce":         "restricted",
		"pod-security.kubernetes.io/enforce-version": "latest",
	})
}

// appNamespace is a namespace for ordinary (non-sandbox) pods, deleted when the test ends.
func appNamespace(t *testing.T) string {
	t.Helper()
	return testNamespace(t, "app-", nil)
}

// testNamespace creates a namespace named after the test with labels, waits for its default
// ServiceAccount and deletes it when the test ends.
func testNamespace(t *testing.T, prefix string, labels map[string]string) string {
	t.Helper()
	name := prefix + strings.Trim(dnsName(strings.ToLower(t.Name())), "-")
	if len(name) > 50 {
		name = strings.TrimRight(name[:50], "-")
	}
	return createNamespace(t, fmt.Sprintf("%s-%d", name, time.Now().UnixNano()%100000), labels)
}

// testNamespaceNamed is testNamespace for a namespace whose name is given, as the official
// layouts of other charts name theirs.
func testNamespaceNamed(t *testing.T, name string) string {
	t.Helper()
	return createNamespace(t, name, nil)
}

func createNamespace(t *testing.T, name string, labels map[string]string) string {
	t.Helper()
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	var err error
	// A name that tests share (testNamespaceNamed) may still be the previous test's
	// namespace, terminating: its deletion waits for its pods' grace periods.
	harness.Wait(t, "namespace "+name+" created", func() (bool, error) {
		_, err = kube.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return err == nil, err
		}
		return true, nil
	}, harness.Within(2*time.Minute))
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := kube.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", name, err)
		}
	})
	harness.Wait(t, "default ServiceAccount in "+name, func() (bool, error) {
		_, err := kube.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	return name
}

func dnsName(s string) string {
	var b strings.Builder
	for _, r := range s {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// newProvider is the real Kubernetes backend on the test cluster: real client-go, pods/exec
// over WebSocket with the SPDY fallback, the sandbox image imported on the node.
func newProvider(t testing.TB, namespace, worker string, edit ...func(*sandbox.KubernetesConfig)) *sandbox.KubernetesProvider {
	t.Helper()
	cfg := sandbox.KubernetesConfig{
		Client:          kube.Client,
		RESTConfig:      kube.RESTConfig,
		Namespace:       namespace,
		Image:           cluster.SandboxImage,
		ImagePullPolicy: corev1.PullNever,
		WorkerID:        worker,
		StartTimeout:    2 * time.Minute,
	}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := sandbox.NewKubernetes(cfg)
	if err != nil {
		t.Fatalf("NewKubernetes: %v", err)
	}
	return p
}

// withBridge gives newProvider's pods the bridge from image (the release image, make image);
// "": none, each call a pods/exec of its own.
func withBridge(image string) func(*sandbox.KubernetesConfig) {
	return func(c *sandbox.KubernetesConfig) { c.BridgeImage = image }
}

// sandboxPods lists the Boxcar sandbox pods in a namespace.
func sandboxPods(ctx context.Context, namespace string) ([]corev1.Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{sandbox.LabelManagedBy: "boxcar", sandbox.LabelComponent: "sandbox"})
	list, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// noSandboxLeft waits until the namespace has no sandbox pod in the API and no container on
// the node: a pod deleted with no grace period leaves the API at once, its containers later.
func noSandboxLeft(t *testing.T, ns string) {
	t.Helper()
	ctx := t.Context()
	harness.Wait(t, "no sandbox pod or container left in "+ns, func() (bool, error) {
		pods, err := sandboxPods(ctx, ns)
		if err != nil {
			return false, err
		}
		if len(pods) > 0 {
			return false, fmt.Errorf("%d sandbox pods left, first %s", len(pods), pods[0].Name)
		}
		ids, err := kube.RunningContainers(ctx, ns, "")
		if err != nil {
			return false, err
		}
		if len(ids) > 0 {
			return false, fmt.Errorf("%d containers still running on the node: %v", len(ids), ids)
		}
		return true, nil
	})
}

// runSalesJob submits the csv-analyst profile's job on examples/sales.csv through the submit
// command's Run with env, waits for it to succeed and checks that its report holds the figure
// the tool computed in the sandbox pod. It returns the job's run folder in the file store at
// storeDir and the job's parsed manifest.
func runSalesJob(t *testing.T, env map[string]string, storeDir string) (string, provenance.Statement) {
	t.Helper()
	start := time.Now()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	err := submitcmd.Run(ctx, []string{"run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--wait", "--output", "json"},
		func(k string) string { return env[k] }, &stdout, &stderr)
	if err != nil {
		t.Fatalf("submit run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("job done in %s", time.Since(start).Round(time.Millisecond))
	var res map[string]any
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line of submit's stdout is not JSON: %v\n%s", err, stdout.String())
	}
	if res["state"] != "succeeded" {
		t.Fatalf("job state = %v, want succeeded: %v\n%s", res["state"], res, stderr.String())
	}
	id, _ := res["id"].(string)
	run := filepath.Join(storeDir, "tenants", "default", "runs", id)
	manifest, err := os.ReadFile(filepath.Join(run, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	stmt, err := provenance.Parse(manifest)
	if err != nil {
		t.Fatalf("parse manifest: %v", err)
	}
	report, err := os.ReadFile(runFile(t, storeDir, stmt, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	// 92 units over 12 rows of examples/sales.csv, summed by busybox awk in the sandbox pod.
	if !strings.Contains(string(report), "| units | 12 | 92.00 |") {
		t.Errorf("report lacks the units figure the tool computed in the pod:\n%s", report)
	}
	return run, stmt
}

// runFile is where the file store at storeDir keeps the run's file name, as its manifest
// names it (in the folder of the attempt that committed), the way get and verify find it.
func runFile(t *testing.T, storeDir string, stmt provenance.Statement, name string) string {
	t.Helper()
	for _, s := range stmt.Subjects {
		if s.Name == name {
			return filepath.Join(storeDir, "tenants", "default", filepath.FromSlash(provenance.SubjectKey(stmt.Predicate.Job.ID, s)))
		}
	}
	t.Fatalf("the manifest of %s names no %s", stmt.Predicate.Job.ID, name)
	return ""
}
