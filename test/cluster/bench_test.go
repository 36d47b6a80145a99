package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

const benchPods = 20

// BenchmarkPodStart is row 7 of make bench: sandbox Start through the Kubernetes backend
// (create, watch until Running, ready for exec) against bare client-go doing create, watch
// until the container runs, on the very pod spec the backend made (read back from the API
// server, so the two stay alike). 20 pods of each per iteration, alternating; the p50 and p95
// of start are reported. Each pod is deleted and gone before the next starts; the delete is
// not timed.
func BenchmarkPodStart(b *testing.B) {
	ctx := context.Background()
	ns := benchNamespace(b)
	p := newProvider(b, ns, "bench")
	pods := kube.Client.CoreV1().Pods(ns)
	gone := func(name string) {
		harness.Wait(b, "pod "+name+" gone", func() (bool, error) {
			_, err := pods.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, fmt.Errorf("pod %s still there (%v)", name, err)
		}, harness.Within(2*time.Minute))
	}

	var template *corev1.Pod
	boxcar := func(i int) time.Duration {
		begin := time.Now()
		sb, err := p.Start(ctx, sandboxtest.Spec(fmt.Sprintf("bench-%d", i), config.SandboxSpec{}))
		if err != nil {
			b.Fatalf("Start: %v", err)
		}
		elapsed := time.Since(begin)
		name := sb.Info().ID
		if template == nil {
			pod, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			template = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Annotations: pod.Annotations}, Spec: *pod.Spec.DeepCopy()}
			template.Spec.NodeName = ""
		}
		if err := sb.Close(ctx); err != nil {
			b.Fatalf("Close: %v", err)
		}
		gone(name)
		return elapsed
	}
	bare := func(i int) time.Duration {
		pod := template.DeepCopy()
		pod.Name = fmt.Sprintf("bare-%d-%d", time.Now().UnixNano()%1000000, i)
		begin := time.Now()
		byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String()}
		w, err := pods.Watch(ctx, byName)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			w.Stop()
			b.Fatalf("create: %v", err)
		}
		timeout := time.After(2 * time.Minute)
	wait:
		for {
			select {
			case ev, open := <-w.ResultChan():
				if !open || ev.Type == watch.Error {
					// An API server ends a watch when it likes (its timeout, a compaction), and
					// every client-go user watches again: the new watch starts with the pod as it is.
					w.Stop()
					b.Logf("watch of %s ended (%v); watching again", pod.Name, ev.Object)
					if w, err = pods.Watch(ctx, byName); err != nil {
						b.Fatal(err)
					}
					continue
				}
				if got, ok := ev.Object.(*corev1.Pod); ok && got.Status.Phase == corev1.PodRunning &&
					slices.ContainsFunc(got.Status.ContainerStatuses, func(cs corev1.ContainerStatus) bool { return cs.State.Running != nil }) {
					break wait
				}
			case <-timeout:
				w.Stop()
				b.Fatalf("pod %s not running within 2m", pod.Name)
			}
		}
		elapsed := time.Since(begin)
		w.Stop()
		var now int64
		if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &now}); err != nil {
			b.Fatalf("delete: %v", err)
		}
		gone(pod.Name)
		return elapsed
	}

	boxcar(-1) // warm up and take the template
	bare(-1)
	var tBoxcar, tBare []time.Duration
	b.ResetTimer()
	for range b.N {
		for i := range benchPods {
			tBoxcar, tBare = append(tBoxcar, boxcar(i)), append(tBare, bare(i))
		}
	}
	b.StopTimer()
	q := func(d []time.Duration, f float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(int(f*float64(len(s))), len(s)-1)]
	}
	for _, f := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p95", 0.95}} {
		x, y := q(tBoxcar, f.q), q(tBare, f.q)
		b.ReportMetric(float64(x)/1e6, "boxcar-"+f.name+"-ms")
		b.ReportMetric(float64(y)/1e6, "bare-"+f.name+"-ms")
		b.ReportMetric(float64(x)/float64(y), "x-of-bare-"+f.name)
	}
}

// benchNamespace is a namespace of its own under Pod Security "restricted", removed afterwards.
func benchNamespace(b *testing.B) string {
	b.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("sb-bench-%d", time.Now().UnixNano()%100000)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce":         "restricted",
		"pod-security.kubernetes.io/enforce-version": "latest",
	}}}
	if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		b.Fatalf("create namespace %s: %v", name, err)
	}
	b.Cleanup(func() {
		if err := kube.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			b.Errorf("delete namespace %s: %v", name, err)
		}
	})
	harness.Wait(b, "the default ServiceAccount in "+name, func() (bool, error) {
		_, err := kube.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	return name
}

// BenchmarkPodEgressLifecycle is row 13 of make bench: a sandbox pod's life with networking on
// (Start with the bridge's init container, AttachEgress: the CA written and the tunnel's exec
// up, Exec true, Close) against off (Start, Exec true, Close), alternating, benchEgressPods of
// each per iteration; the medians and their ratio are reported. Each pod is gone before the
// next starts; that wait is not timed. It needs the release image (make image).
func BenchmarkPodEgressLifecycle(b *testing.B) {
	ctx := context.Background()
	ns := benchNamespace(b)
	release, _ := importReleaseImage(b)
	on, off := newProvider(b, ns, "bench", withBridge(release)), newProvider(b, ns, "bench")
	req := sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second}
	life := func(p *sandbox.KubernetesProvider, i int) time.Duration {
		begin := time.Now()
		sb, err := p.Start(ctx, sandboxtest.Spec(fmt.Sprintf("bench-egress-%d", i), config.SandboxSpec{CPU: "250m"}))
		if err != nil {
			b.Fatalf("Start: %v", err)
		}
		if p == on {
			ln, err := sb.(sandbox.Egress).AttachEgress(ctx, []byte("ca"))
			if err != nil {
				b.Fatalf("AttachEgress: %v", err)
			}
			defer ln.Close()
		}
		if res, err := sb.Exec(ctx, req); err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
		}
		if err := sb.Close(ctx); err != nil {
			b.Fatalf("Close: %v", err)
		}
		elapsed := time.Since(begin)
		noPod(b, ns, sb.Info().ID)
		return elapsed
	}
	life(on, -1) // warm up: the release image's first init container
	life(off, -1)
	var tOn, tOff []time.Duration
	b.ResetTimer()
	for range b.N {
		for i := range benchEgressPods {
			tOn, tOff = append(tOn, life(on, i)), append(tOff, life(off, i))
		}
	}
	b.StopTimer()
	med := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	x, y := med(tOn), med(tOff)
	b.ReportMetric(float64(x)/1e6, "network-ms/op")
	b.ReportMetric(float64(y)/1e6, "none-ms/op")
	b.ReportMetric(float64(x)/float64(y), "x-of-none")
	record("pod lifecycle with egress (Start+AttachEgress+Exec true+Close) %s vs %s without a network, medians of %d", x.Round(time.Millisecond), y.Round(time.Millisecond), len(tOn))
}

const benchEgressPods = 6

// noPod waits until the pod is gone from the API server.
func noPod(b *testing.B, ns, name string) {
	harness.Wait(b, "pod "+name+" gone", func() (bool, error) {
		_, err := kube.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("pod %s still there (%v)", name, err)
	}, harness.Within(2*time.Minute))
}
