package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestNATSOfficialLayout runs NATS as the official chart lays it out (testdata/nats.yaml) and
// looks at it from a pod, as a worker and KEDA would: the client Service answers on 4222, the
// monitoring port is reachable through the headless Service only, the pod has its DNS name,
// and JetStream keeps its store on the claimed volume.
func TestNATSOfficialLayout(t *testing.T) {
	ctx := t.Context()
	store := installNATS(t)

	ns := appNamespace(t)
	const monitorAnswer = `"store_dir"`
	out := runPod(t, ns, "client", `
		`+retry(`printf 'PING\r\n' | nc -w 3 nats.nats.svc.`+cluster.ClusterDomain+` 4222 | grep -q '^INFO {'`)+`
		echo CLIENT-PORT-OK
		`+retry(`timeout 5 wget -q -O- http://nats-headless.nats.svc.`+cluster.ClusterDomain+`:8222/jsz`)+`
		echo
		nslookup nats-0.nats-headless.nats.svc.`+cluster.ClusterDomain+`
		if timeout 5 wget -q -O- http://nats.nats.svc.`+cluster.ClusterDomain+`:8222/varz; then echo CLIENT-SERVICE-MONITOR-REACHED; fi`)
	pod, err := kube.Client.CoreV1().Pods("nats").Get(ctx, "nats-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CLIENT-PORT-OK", monitorAnswer, "Address: " + pod.Status.PodIP} {
		if !strings.Contains(out, want) {
			t.Errorf("the client pod's output lacks %q:\n%s", want, out)
		}
	}
	// The official layout's client Service has no monitoring port: an endpoint of
	// nats.nats.svc.cluster.local:8222 (as KEDA's default would be) reaches nothing.
	if strings.Contains(out, "CLIENT-SERVICE-MONITOR-REACHED") {
		t.Errorf("nats.nats.svc:8222 answered; the official layout exposes 8222 on nats-headless only:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(store, "jetstream")); err != nil {
		t.Errorf("JetStream's store is not on the claimed volume: %v", err)
	}
}

// installNATS imports the NATS image, gives its volume claim a volume in a host folder, applies
// testdata/nats.yaml to namespace nats and waits until the StatefulSet's pod is Ready (its
// probes are the kubelet's HTTP requests over the bridge). It returns the volume's folder.
func installNATS(t *testing.T) string {
	t.Helper()
	return installNATSWith(t, "")
}

// installNATSWith is installNATS with authConf (the auth.conf of `worker nats-config`: the
// operator and accounts) in the Secret nats-auth, which the server includes as a user of the
// NATS chart does (deploy/helm/boxcar/README.md); "" runs NATS without auth.
func installNATSWith(t *testing.T, authConf string) string {
	t.Helper()
	ctx := t.Context()
	bin := filepath.Join(cluster.CacheDir(), "images", "nats-server")
	version, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v; run test/cluster/build.sh", bin, err)
	}
	image := "boxcar.test/nats:" + strings.TrimPrefix(strings.TrimSpace(string(version)), "nats-server: ")
	if err := kube.ImportImage(ctx, image, map[string]string{"/nats-server": bin}, []string{"/nats-server"}); err != nil {
		t.Fatal(err)
	}

	// No provisioner runs here: a class without one, and a volume made ahead for the claim.
	store := t.TempDir()
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "boxcar-local-" + fmt.Sprint(time.Now().UnixNano()%100000)}, Provisioner: "kubernetes.io/no-provisioner"}
	if _, err := kube.Client.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hostPath := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: class.Name + "-nats-js"},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:              class.Name,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: store, Type: &hostPath}},
		},
	}
	if _, err := kube.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_ = kube.Client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
		_ = kube.Client.StorageV1().StorageClasses().Delete(ctx, class.Name, metav1.DeleteOptions{})
	})

	ns := testNamespaceNamed(t, "nats")
	include := ""
	if authConf != "" {
		createSecret(t, ns, "nats-auth", map[string][]byte{"auth.conf": []byte(authConf)})
		include = "include ../nats-auth/auth.conf;"
	}
	applyManifest(t, ns, "testdata/nats.yaml", "{{IMAGE}}", image, "{{STORAGE_CLASS}}", class.Name, "{{INCLUDE}}", include)
	harness.Wait(t, "StatefulSet nats Ready", func() (bool, error) {
		ss, err := kube.Client.AppsV1().StatefulSets(ns).Get(ctx, "nats", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if ss.Status.ReadyReplicas == 1 {
			return true, nil
		}
		pod, err := kube.Client.CoreV1().Pods(ns).Get(ctx, "nats-0", metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("0 of 1 replicas ready: %w", err)
		}
		return false, fmt.Errorf("0 of 1 replicas ready; nats-0: phase %s, containers %+v", pod.Status.Phase, pod.Status.ContainerStatuses)
	}, harness.Within(3*time.Minute))
	return store
}

// applyManifest creates the objects of a testdata manifest in ns, with each placeholder
// (old, new pairs) replaced.
func applyManifest(t *testing.T, ns, path string, replace ...string) {
	t.Helper()
	ctx := t.Context()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	manifest := strings.NewReplacer(replace...).Replace(string(data))
	for _, obj := range decodeAll(t, []byte(manifest)) {
		var err error
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			_, err = kube.Client.CoreV1().ConfigMaps(ns).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Service:
			_, err = kube.Client.CoreV1().Services(ns).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.StatefulSet:
			_, err = kube.Client.AppsV1().StatefulSets(ns).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.Deployment:
			_, err = kube.Client.AppsV1().Deployments(ns).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: no case for %T", path, obj)
		}
		if err != nil {
			t.Fatalf("%s: create %T: %v", path, obj, err)
		}
	}
}

// decodeAll decodes a multi-document YAML manifest into typed objects.
func decodeAll(t *testing.T, manifest []byte) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("read manifest: %v", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decode manifest document: %v\n%s", err, doc)
		}
		objs = append(objs, obj)
	}
}
