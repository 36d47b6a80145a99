package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/boxcar-run/boxcar/test/harness"
)

// PortForward forwards a port the kernel picks on the host's 127.0.0.1 to port of a pod, as
// `kubectl port-forward` does: through the API server's pods/portforward over SPDY, to the
// kubelet, which connects to the port from inside the pod's network namespace. So the host
// reaches a pod without dialling any pod address. It returns the local host:port; the
// forward ends with ctx.
func (h *Handle) PortForward(ctx context.Context, namespace, pod string, port int) (string, error) {
	rt, upgrader, err := spdy.RoundTripperFor(h.RESTConfig)
	if err != nil {
		return "", fmt.Errorf("cluster: port-forward to %s/%s: %w", namespace, pod, err)
	}
	url := h.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, url)
	ready := make(chan struct{})
	errOut := &harness.LogBuffer{}
	fw, err := portforward.NewOnAddressesWithContext(ctx, dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, ready, io.Discard, errOut)
	if err != nil {
		return "", fmt.Errorf("cluster: port-forward to %s/%s: %w", namespace, pod, err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		return "", fmt.Errorf("cluster: port-forward to %s/%s:%d: %w: %s", namespace, pod, port, err, errOut.String())
	case <-ctx.Done():
		return "", fmt.Errorf("cluster: port-forward to %s/%s:%d: %w", namespace, pod, port, ctx.Err())
	case <-time.After(time.Minute):
		return "", fmt.Errorf("cluster: port-forward to %s/%s:%d not ready after a minute: %s", namespace, pod, port, errOut.String())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		return "", fmt.Errorf("cluster: port-forward to %s/%s:%d: no local port (%v)", namespace, pod, port, err)
	}
	return "127.0.0.1:" + strconv.Itoa(int(ports[0].Local)), nil
}
