package sandbox

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// errOwnerReplaced: the garbage collector deleted a pod as it started, because its owner had
// been made again under a new UID (kubectl delete and apply, a reinstall, a rollback). Start
// tries once more with the owner looked up again.
var errOwnerReplaced = errors.New("the pods' owner ConfigMap was made again under a new UID, and the garbage collector deleted the pod that named the old one")

// errOwnerMissing: the pods' owner ConfigMap is not there (deleted with its namespace or the
// release); no pod may start without it, as the garbage collector would delete it at once.
var errOwnerMissing = errors.New("it does not exist")

// ownerRef is the ownerReference every sandbox pod carries when Owner is set: the ConfigMap
// that stands for this deployment of workers in the sandbox namespace. A worker removes its
// pods itself while it may, but `helm uninstall` deletes the workers' ServiceAccount and Role
// together with the workers, and from then on their token is refused: the pods of a draining
// worker, warm or running, would stay. Deleting the owner has Kubernetes' garbage collector
// delete them instead, whatever became of the workers. It is looked up once and kept until
// Check (lookUpOwner) or a start (ownerReplaced) finds the ConfigMap gone or made again: a
// pod naming a UID that no longer exists is deleted by the garbage collector at once.
func (p *KubernetesProvider) ownerRef(ctx context.Context) (*metav1.OwnerReference, error) {
	if p.cfg.Owner == "" {
		return nil, nil
	}
	p.ownerMu.Lock()
	defer p.ownerMu.Unlock()
	if p.owner != nil {
		return p.owner, nil
	}
	return p.lookUpOwnerLocked(ctx)
}

// lookUpOwner reads the owner from the API server and keeps what it finds: Check calls it, so
// that a worker whose owner is gone is not ready, and one whose owner was made again starts
// its next pods with the new UID.
func (p *KubernetesProvider) lookUpOwner(ctx context.Context) (*metav1.OwnerReference, error) {
	if p.cfg.Owner == "" {
		return nil, nil
	}
	p.ownerMu.Lock()
	defer p.ownerMu.Unlock()
	return p.lookUpOwnerLocked(ctx)
}

func (p *KubernetesProvider) lookUpOwnerLocked(ctx context.Context) (*metav1.OwnerReference, error) {
	cm, err := p.cfg.Client.CoreV1().ConfigMaps(p.cfg.Namespace).Get(ctx, p.cfg.Owner, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			p.owner = nil
			err = fmt.Errorf("%w (%s): %w", errOwnerMissing, remake, err)
		}
		return nil, fmt.Errorf("sandbox: kubernetes: look up ConfigMap %s in namespace %s, the owner of the sandbox pods (sandbox.kubernetes.owner; the chart makes it, and its Role grants get configmaps): %w", p.cfg.Owner, p.cfg.Namespace, err)
	}
	if p.owner != nil && p.owner.UID != cm.UID {
		p.log.Warn("the sandbox pods' owner was made again: new pods name its new UID", "owner", cm.Name, "old_uid", p.owner.UID, "uid", cm.UID)
	}
	p.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID}
	return p.owner, nil
}

// ownerReplaced is the error of a pod that went while it started (errPodDeleted): when the pod
// named an owner that no longer is the live one, it wraps errOwnerReplaced as well, so that
// Start tries again with the owner lookUpOwner found. Any other error stays as it is.
func (p *KubernetesProvider) ownerReplaced(ctx context.Context, used *metav1.OwnerReference, err error) error {
	if used == nil || !errors.Is(err, errPodDeleted) {
		return err
	}
	live, lookErr := p.lookUpOwner(ctx)
	switch {
	case lookErr != nil:
		return fmt.Errorf("%w (%w)", err, lookErr)
	case live.UID != used.UID:
		return fmt.Errorf("%w: %w", err, errOwnerReplaced)
	}
	return err
}
