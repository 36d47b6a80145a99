package cluster_test

import (
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/harness"
)

// The tests here are what a worker-side pod needs: another pod over the bridge, a Service by
// its ClusterIP (kube-proxy) and by its name (CoreDNS), the API server through the kubernetes
// Service. Every address dialled is one the cluster gave inside its own namespaces.

func TestPodToPod(t *testing.T) {
	ns := appNamespace(t)
	web := webServer(t, ns)
	out := runPod(t, ns, "client", `
		cat /proc/net/route
		`+retry(`timeout 5 wget -q -O- http://`+web.Status.PodIP+`:8080/`))
	if !strings.Contains(out, "hello from web") {
		t.Errorf("wget of the web pod at %s:8080 from another pod: want its page, got:\n%s", web.Status.PodIP, out)
	}
	// The client's routes: the bridge's subnet on its link and the Services through the node
	// address; no default route, so nothing off the bridge is reachable.
	routes := routeTable(out)
	want := map[string]string{"198.18.0.0/17": "0.0.0.0", cluster.ServiceCIDR: cluster.NodeIP}
	if len(routes) != len(want) {
		t.Errorf("routes = %v, want exactly %v", routes, want)
	}
	for dst, gw := range want {
		if routes[dst] != gw {
			t.Errorf("route to %s via %q, want via %s (all routes %v)", dst, routes[dst], gw, routes)
		}
	}
}

func TestServiceByClusterIP(t *testing.T) {
	ns := appNamespace(t)
	webServer(t, ns)
	svc := webService(t, ns)
	out := runPod(t, ns, "client", retry(`timeout 5 wget -q -O- http://`+svc.Spec.ClusterIP+`/`))
	if !strings.Contains(out, "hello from web") {
		t.Errorf("wget http://%s/ (the web Service's ClusterIP) from a pod: want the web pod's page, got:\n%s", svc.Spec.ClusterIP, out)
	}
}

func TestClusterDNS(t *testing.T) {
	ns := appNamespace(t)
	webServer(t, ns)
	svc := webService(t, ns)
	fqdn := "web." + ns + ".svc." + cluster.ClusterDomain
	out := runPod(t, ns, "client", `
		cat /etc/resolv.conf
		`+retry(`nslookup `+fqdn)+`
		nslookup kubernetes.default.svc.`+cluster.ClusterDomain+`
		`+retry(`timeout 5 wget -q -O- http://web/`)+`
		if nslookup boxcar.invalid; then echo OUTSIDE-RESOLVED; fi`)
	for _, want := range []string{
		"nameserver " + cluster.DNSServiceIP, // the kubelet's clusterDNS
		"search " + ns + ".svc." + cluster.ClusterDomain,
		svc.Spec.ClusterIP,          // the FQDN's answer
		cluster.KubernetesServiceIP, // kubernetes.default through the search path
		"hello from web",            // the short name, served through the Service
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the pod's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "OUTSIDE-RESOLVED") {
		t.Errorf("a name outside the cluster resolved; CoreDNS must not forward:\n%s", out)
	}
}

func TestKubernetesServiceFromPod(t *testing.T) {
	ns := appNamespace(t)
	// Plain HTTP to the API server's TLS port: Go's TLS server answers it in plain text, which
	// shows that the name, the Service, kube-proxy and the relay took the pod to the API server.
	const answer = "Client sent an HTTP request to an HTTPS server"
	out := runPod(t, ns, "client", retry(`printf 'GET /readyz HTTP/1.0\r\n\r\n' | nc -w 5 kubernetes.default.svc 443 | grep "`+answer+`"`))
	if !strings.Contains(out, answer) {
		t.Errorf("a pod does not reach the API server at kubernetes.default.svc:443:\n%s", out)
	}
}

// TestHostNetworkUntouched checks that the bridge, its addresses and kube-proxy's rules are in
// the cluster's node namespace, not the host's.
func TestHostNetworkUntouched(t *testing.T) {
	links, err := exec.Command("ip", "-o", "addr").CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr: %v: %s", err, links)
	}
	if strings.Contains(string(links), "cbr0") || strings.Contains(string(links), "198.18.") {
		t.Errorf("the host's namespace has the cluster's bridge or an address of it:\n%s", links)
	}
	rules, err := exec.Command("iptables-save").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-save: %v: %s", err, rules)
	}
	if strings.Contains(string(rules), "KUBE-") {
		t.Errorf("the host's iptables have kube-proxy's chains:\n%s", rules)
	}
}

// webServer runs busybox httpd on port 8080 in a pod labelled app=web and returns the pod once
// it runs. Its readiness is an exec probe: the kubelet, on the host, has no route to pods.
func webServer(t *testing.T, ns string) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	pod := testPod("web", `mkdir -p /tmp/www && echo "hello from web" > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www`)
	pod.Labels = map[string]string{"app": "web"}
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	pod.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/"}}},
		PeriodSeconds: 1,
	}
	if _, err := kube.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create web pod: %v", err)
	}
	var got *corev1.Pod
	harness.Wait(t, "web pod Ready", func() (bool, error) {
		p, err := kube.Client.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				got = p
				return true, nil
			}
		}
		return false, fmt.Errorf("phase %s", p.Status.Phase)
	}, harness.Within(2*time.Minute))
	return got
}

func webService(t *testing.T, ns string) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	svc, err := kube.Client.CoreV1().Services(ns).Create(t.Context(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create web Service: %v", err)
	}
	return svc
}

// runPod runs script in a pod to completion and returns its log (stdout and stderr). The pod
// must succeed.
func runPod(t *testing.T, ns, name, script string) string {
	t.Helper()
	ctx := t.Context()
	pods := kube.Client.CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, testPod(name, script+"\n"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	var phase corev1.PodPhase
	harness.Wait(t, "pod "+name+" to finish", func() (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase = p.Status.Phase
		if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			return true, nil
		}
		return false, fmt.Errorf("phase %s", phase)
	}, harness.Within(3*time.Minute))
	logs, err := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of pod %s: %v", name, err)
	}
	if phase != corev1.PodSucceeded {
		t.Fatalf("pod %s %s; its log:\n%s", name, phase, logs)
	}
	return string(logs)
}

func testPod(name, script string) *corev1.Pod {
	var zero int64
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "main", Image: cluster.SandboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-ec", script},
			}},
		},
	}
}

// retry is a shell loop that runs cmd until it succeeds, for up to 60 tries a second apart:
// kube-proxy and CoreDNS see a new Service or endpoint a moment after the API does.
func retry(cmd string) string {
	return `i=0; until ` + cmd + `; do i=$((i+1)); [ $i -lt 60 ] || exit 1; sleep 1; done`
}

// routeTable reads /proc/net/route lines out of text: destination/prefix -> gateway.
func routeTable(text string) map[string]string {
	routes := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		// Iface Destination Gateway Flags RefCnt Use Metric Mask ...
		f := strings.Fields(line)
		if len(f) < 8 || f[0] == "Iface" {
			continue
		}
		dst, gw, mask := hexIP(f[1]), hexIP(f[2]), hexIP(f[7])
		if dst == nil || gw == nil || mask == nil {
			continue
		}
		ones, _ := net.IPMask(mask).Size()
		routes[fmt.Sprintf("%s/%d", dst, ones)] = gw.String()
	}
	return routes
}

// hexIP decodes an address of /proc/net/route: 8 hex digits, little-endian.
func hexIP(h string) net.IP {
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != 4 {
		return nil
	}
	return net.IPv4(b[3], b[2], b[1], b[0]).To4()
}
