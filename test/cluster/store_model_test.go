package cluster_test

import (
	"crypto/rand"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestStoreAndModelPods runs versitygw and the scripted model as pods from images made here
// (testdata/store-and-model.yaml) and reaches both by Service name from another pod, as a
// worker pod would: the S3 endpoint is up and refuses an unsigned request, and the model
// lists its model.
func TestStoreAndModelPods(t *testing.T) {
	ns := appNamespace(t)
	installStoreAndModel(t, ns)

	out := runPod(t, ns, "client", `
		`+retry(`timeout 5 wget -q -O- http://versitygw:7070/health`)+`
		echo; echo S3-HEALTHY
		timeout 5 wget -q -O- http://versitygw:7070/ 2>&1 || true
		`+retry(`timeout 5 wget -q -O- http://model:8080/v1/models`))
	for _, want := range []string{"S3-HEALTHY", "403", `"id":"` + demomodel.ModelID + `"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the client pod's output lacks %q:\n%s", want, out)
		}
	}
}

// installStoreAndModel imports the versitygw and scripted model images and runs both in ns
// from testdata/store-and-model.yaml, as Deployments behind the Services versitygw (:7070)
// and model (:8080), and waits until both are available. versitygw's root credentials are
// the Secret boxcar-s3 it makes in ns (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY: the keys the
// chart's s3.credentialsSecret expects); it returns them.
func installStoreAndModel(t *testing.T, ns string) (accessKey, secretKey string) {
	t.Helper()
	ctx := t.Context()
	gw, err := s3test.Binary()
	if err != nil {
		t.Fatal(err)
	}
	gwFiles, err := withSharedLibraries("/versitygw", gw)
	if err != nil {
		t.Fatal(err)
	}
	images := []struct {
		ref, entry string
		files      map[string]string
	}{
		{storeImage, "/versitygw", gwFiles},
		{modelImage, "/demo-model", map[string]string{"/demo-model": filepath.Join(cluster.CacheDir(), "images", "demo-model")}},
	}
	for _, img := range images {
		if err := kube.ImportImage(ctx, img.ref, img.files, []string{img.entry}); err != nil {
			t.Fatalf("%v (run test/cluster/build.sh)", err)
		}
	}

	accessKey, secretKey = "boxcar-test", rand.Text()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "boxcar-s3"}, StringData: map[string]string{
		"AWS_ACCESS_KEY_ID": accessKey, "AWS_SECRET_ACCESS_KEY": secretKey,
	}}
	if _, err := kube.Client.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applyManifest(t, ns, "testdata/store-and-model.yaml", "{{VERSITYGW_IMAGE}}", storeImage, "{{MODEL_IMAGE}}", modelImage)
	for _, name := range []string{"versitygw", "model"} {
		harness.Wait(t, "Deployment "+name+" available", func() (bool, error) {
			d, err := kube.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if d.Status.AvailableReplicas != 1 {
				return false, fmt.Errorf("%d of 1 available", d.Status.AvailableReplicas)
			}
			return true, nil
		}, harness.Within(2*time.Minute))
	}
	return accessKey, secretKey
}

// The images of installStoreAndModel, made from binaries on the host.
const (
	storeImage = "boxcar.test/versitygw:1"
	modelImage = "boxcar.test/model:1"
)

// withSharedLibraries maps name in an image to bin on the host, plus the shared libraries
// and loader bin needs at the paths the host has them (none for a static binary): a
// go-installed versitygw links against libc when a C compiler was around.
func withSharedLibraries(name, bin string) (map[string]string, error) {
	files := map[string]string{name: bin}
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return files, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", bin, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			files[f[2]] = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			files[f[0]] = f[0]
		}
	}
	return files, nil
}
