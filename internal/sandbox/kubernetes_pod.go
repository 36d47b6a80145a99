package sandbox

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/boxcar-run/boxcar/internal/config"
)

// imageDigest takes the digest out of an image id such as docker.io/library/x@sha256:….
func imageDigest(imageID string) string {
	if i := strings.LastIndex(imageID, "@"); i >= 0 {
		return imageID[i+1:]
	}
	return imageID
}

// isolationOf is what the pod is held to, as the manifest's sandbox.isolation says it: what
// its spec enforces, and the network as the deployment configured it (NetworkPolicy). A
// pod's processes have no bound of its own: the profile's pids is not claimed (Info.PIDs is
// 0), and only the kubelet's podPidsLimit, which the operator sets on the node, bounds them.
func (p *KubernetesProvider) isolationOf(pod *corev1.Pod) string {
	var b strings.Builder
	b.WriteString("pod; pss=restricted; non-root; capabilities=none; seccomp=RuntimeDefault; root=read-only; service-account-token=none")
	if rc := pod.Spec.RuntimeClassName; rc != nil {
		fmt.Fprintf(&b, "; runtime_class=%s", *rc)
	}
	lim := pod.Spec.Containers[0].Resources.Limits
	fmt.Fprintf(&b, "; limits=cpu:%s,memory:%s,ephemeral-storage:%s", lim.Cpu(), lim.Memory(), lim.StorageEphemeral())
	b.WriteString("; pids=none per pod (the node's podPidsLimit, where set)")
	// The kernel counts message queues, pending signals, inotify instances and pipe pages per
	// host uid, and every sandbox pod runs as the same one in the node's user namespace.
	if sc := pod.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		fmt.Fprintf(&b, "; per_uid_limits=shared by the node's pods of uid %d", *sc.RunAsUser)
	}
	b.WriteString(podNetworkIsolation[p.cfg.NetworkPolicy])
	if d := pod.Spec.ActiveDeadlineSeconds; d != nil {
		fmt.Fprintf(&b, "; active_deadline=%ds", *d)
	}
	return b.String()
}

// podNetworkIsolation is what each NetworkPolicy setting lets the manifest say of the network.
var podNetworkIsolation = map[string]string{
	config.NetworkPolicyDenyAll: "; network=deny-all NetworkPolicy on " + LabelComponent + "=" + componentValue,
	config.NetworkPolicyNone:    "; network=not isolated: no NetworkPolicy, the pod network's defaults",
}

// dnsUnsafe and labelUnsafe find what pod names and label values may not hold.
var (
	dnsUnsafe   = regexp.MustCompile(`[^a-z0-9-]+`)
	labelUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)
)

func validLabel(s string) string {
	s = strings.Trim(labelUnsafe.ReplaceAllString(s, "-"), "-_.")
	if len(s) > 63 {
		s = strings.TrimRight(s[:63], "-_.")
	}
	return s
}

// podFor is the pod of one sandbox. It passes the "restricted" Pod Security Standard: non-root,
// no privilege escalation, no capabilities, RuntimeDefault seccomp, and a read-only root
// filesystem besides; no service-account token, no service links, no secrets, bounded
// resources, a size-limited workdir and /tmp, and a deadline.
func (p *KubernetesProvider) podFor(spec Spec) (*corev1.Pod, error) {
	if spec.Image == "" {
		return nil, errors.New("sandbox: start: the kubernetes backend needs an image: set the profile's sandbox.image (it must hold a POSIX sh)")
	}
	lim, err := parseLimits(spec.SandboxSpec)
	if err != nil {
		return nil, err
	}
	workdir := path.Clean(spec.Workdir)
	if !path.IsAbs(workdir) || workdir == "/" || workdir == "/tmp" || slices.ContainsFunc([]string{"/proc", "/dev", "/sys"}, func(r string) bool {
		return workdir == r || strings.HasPrefix(workdir, r+"/")
	}) {
		return nil, fmt.Errorf("sandbox: start: workdir %q must be an absolute path outside /proc, /dev and /sys and other than / and /tmp, such as /work", spec.Workdir)
	}
	tmpSize := resource.MustParse(p.cfg.TmpSize)
	diskSize := resource.MustParse(spec.Disk)
	resources := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse(spec.CPU),
		corev1.ResourceMemory:           resource.MustParse(spec.Memory),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(lim.disk+tmpSize.Value(), resource.BinarySI),
	}
	name := "boxcar-" + strings.Trim(dnsUnsafe.ReplaceAllString(strings.ToLower(spec.JobID), "-"), "-")
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], "-")
	}
	name += "-" + randomHex(4)
	deadline := max(int64(time.Duration(spec.Lifetime).Seconds()), 1)
	yes, no := true, false
	var grace int64 = 1
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				LabelManagedBy: managedBy,
				LabelComponent: componentValue,
				LabelJobID:     validLabel(spec.JobID),
				LabelWorker:    p.cfg.WorkerID,
			},
			Annotations: map[string]string{annotationJob: spec.JobID},
		},
		Spec: corev1.PodSpec{
			// The host name is the bubblewrap backend's, the same in every pod: by default it is
			// the pod's name, which tells a job whether a pool started its sandbox.
			Hostname:                      hostname,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			ActiveDeadlineSeconds:         &deadline,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &p.cfg.UID,
				RunAsGroup:     &p.cfg.GID,
				FSGroup:        &p.cfg.GID,
				SeccompProfile: seccomp,
			},
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           spec.Image,
				ImagePullPolicy: p.cfg.ImagePullPolicy,
				// The container only has to stay alive; commands arrive through pods/exec.
				Command:    []string{"sh", "-c", pauseScript},
				WorkingDir: workdir,
				// Every exec the worker starts in the container has this environment, past the
				// image's: LC_ALL=C keeps its scripts' tools in the English words the worker reads
				// (podErrnos), whatever language the image names (LANG, LC_*, LANGUAGE, which
				// gettext ignores in the C locale). A job's command starts with env -i and takes
				// none of it: its LANG is the worker's default or the job's own.
				Env: []corev1.EnvVar{
					{Name: "HOME", Value: workdir},
					{Name: "LANG", Value: "C.UTF-8"},
					{Name: "LC_ALL", Value: "C"},
				},
				Resources: corev1.ResourceRequirements{Requests: resources, Limits: resources},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot:             &yes,
					AllowPrivilegeEscalation: &no,
					Privileged:               &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           seccomp,
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "workdir", MountPath: workdir},
					{Name: "tmp", MountPath: "/tmp"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "workdir", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &diskSize}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &tmpSize}}},
			},
		},
	}
	for _, name := range p.cfg.ImagePullSecrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
	}
	p.addBridge(pod)
	if spec.RuntimeClass != "" {
		pod.Spec.RuntimeClassName = &spec.RuntimeClass
	}
	if p.cfg.Instance != "" {
		pod.Labels[LabelInstance] = p.cfg.Instance
	}
	if spec.Tenant != "" {
		pod.Labels[LabelTenant] = validLabel(spec.Tenant)
		pod.Annotations[annotationTenant] = spec.Tenant
	}
	p.poolPod(pod, spec)
	return pod, nil
}
