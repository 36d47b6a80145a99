package cluster_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxcar-run/boxcar/test/cluster"
)

func TestNodeReady(t *testing.T) {
	n, err := kube.Client.CoreV1().Nodes().Get(t.Context(), cluster.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	t.Logf("node %s: kubelet %s, runtime %s", n.Name, n.Status.NodeInfo.KubeletVersion, n.Status.NodeInfo.ContainerRuntimeVersion)
	if n.Status.NodeInfo.KubeletVersion != cluster.KubernetesVersion {
		t.Errorf("kubelet version = %s, want %s", n.Status.NodeInfo.KubeletVersion, cluster.KubernetesVersion)
	}
}
