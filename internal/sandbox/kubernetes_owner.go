package sandbox

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ownerRef is the ownerReference every sandbox pod carries when Owner is set: the ConfigMap
// that stands for this deployment of workers in the sandbox namespace. A worker removes its
// pods itself while it may, but `helm uninstall` deletes the workers' ServiceAccount and Role
// together with the workers, and from then on their token is refused: the pods of a draining
// worker, warm or running, would stay. Deleting the owner has Kubernetes' garbage collector
// delete them instead, whatever became of the workers. It is looked up once and kept.
func (p *KubernetesProvider) ownerRef(ctx context.Context) (*metav1.OwnerReference, error) {
	if p.cfg.Owner == "" {
		return nil, nil
	}
	p.ownerMu.Lock()
	defer p.ownerMu.Unlock()
	if p.owner != nil {
		return p.owner, nil
	}
	cm, err := p.cfg.Client.CoreV1().ConfigMaps(p.cfg.Namespace).Get(ctx, p.cfg.Owner, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("sandbox: kubernetes: look up ConfigMap %s in namespace %s, the owner of the sandbox pods (sandbox.kubernetes.owner; the chart makes it, and its Role grants get configmaps): %w", p.cfg.Owner, p.cfg.Namespace, err)
	}
	p.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID}
	return p.owner, nil
}
