package helm

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestDefaultQuotaHoldsTheFleetsSandboxes: the sandbox namespace's default ResourceQuota holds
// every sandbox pod the release's workers may have at once, as values.yaml says to size it: a
// worker's pods, its warm pools' included, stay within config.concurrency (the pool counts warm,
// starting, taken and closing sandboxes against it: internal/pool's
// TestProfilesHandOverSlotsWithinConcurrency), and a rolling update runs maxSurge workers more
// than the most the autoscaler runs. Each pod asks what the backend gives the largest profile's:
// its cpu and memory, its disk and the /tmp and egress bridge volumes' ephemeral storage.
func TestDefaultQuotaHoldsTheFleetsSandboxes(t *testing.T) {
	const warm = `config:
  profiles:
    big:
      model: {name: gpt-4.1-mini}
      sandbox: {image: busybox:1.37, cpu: "1", memory: 768Mi, disk: 512Mi}
      tools: [{name: read_file}]
      warm: {min: 1, max: 2}`
	for _, vals := range []string{"", "keda: {enabled: true}", warm} {
		r := render(t, values(t, vals))
		cfg := workerConfig(t, r)
		workers := maxWorkers(t, r)
		pods := int64(workers * cfg.Concurrency)
		per := corev1.ResourceList{} // the largest of any profile's pod, resource by resource
		for _, p := range cfg.Profiles {
			pod, _ := startSpecFromChart(t, r, p.Sandbox)
			for res, q := range podLimits(pod) {
				if q.Cmp(per[res]) > 0 {
					per[res] = q
				}
			}
		}
		quotas := all[*corev1.ResourceQuota](r)
		if len(quotas) != 1 {
			t.Fatalf("values %q: %d ResourceQuotas", vals, len(quotas))
		}
		hard := quotas[0].Spec.Hard
		need := corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(pods, resource.DecimalSI)}
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
			q := per[res]
			total := resource.NewQuantity(0, q.Format)
			for range pods {
				total.Add(q)
			}
			need["limits."+res] = *total
		}
		for res, want := range need {
			if got, ok := hard[res]; !ok || got.Cmp(want) < 0 {
				t.Errorf("values %q: the quota's %s is %s; %d workers of %d slots need %s", vals, res, got.String(), workers, cfg.Concurrency, want.String())
			}
		}
	}
}

// maxWorkers is the most workers r runs at once: the autoscaler's maximum (or the fixed
// replicas) and the Deployment's maxSurge during a rolling update.
func maxWorkers(t *testing.T, r *rendered) int {
	t.Helper()
	d := one[*appsv1.Deployment](t, r, fullname)
	n := 0
	if d.Spec.Replicas != nil {
		n = int(*d.Spec.Replicas)
	}
	for _, h := range all[*autoscalingv2.HorizontalPodAutoscaler](r) {
		n = max(n, int(h.Spec.MaxReplicas))
	}
	for _, so := range all[*scaledObject](r) {
		if so.Spec.MaxReplicaCount != nil {
			n = max(n, int(*so.Spec.MaxReplicaCount))
		}
	}
	if n == 0 {
		t.Fatal("no replica count, HPA or ScaledObject")
	}
	surge := 1
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxSurge != nil {
		surge = ru.MaxSurge.IntValue()
	}
	return n + surge
}

// podLimits is what a ResourceQuota's limits.* charge a pod: per resource, the larger of its
// containers' sum and its largest init container.
func podLimits(pod *corev1.Pod) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		sum := resource.Quantity{}
		for _, c := range pod.Spec.Containers {
			sum.Add(c.Resources.Limits[res])
		}
		for _, c := range pod.Spec.InitContainers {
			if l := c.Resources.Limits[res]; l.Cmp(sum) > 0 {
				sum = l
			}
		}
		out[res] = sum
	}
	return out
}

// TestNotesSayWhenTheQuotaIsShort: with more workers (or slots) than the quota's pods hold,
// NOTES.txt says so, counting warm pools' pods among the slots; with enough, it says nothing.
func TestNotesSayWhenTheQuotaIsShort(t *testing.T) {
	for vals, want := range map[string]string{
		"":                               "",
		"autoscaling: {maxReplicas: 30}": "holds 40 pods, fewer than the 62 that 31 workers",
		"keda: {enabled: true, maxReplicaCount: 20}\nconfig: {concurrency: 4}":             "holds 40 pods, fewer than the 84 that 21 workers",
		"autoscaling: {enabled: false}\nreplicas: 25":                                      "holds 40 pods, fewer than the 52 that 26 workers",
		"autoscaling: {maxReplicas: 30}\nsandboxes: {resourceQuota: {hard: {pods: '62'}}}": "",
	} {
		notes := render(t, values(t, vals)).notes
		if got := strings.Contains(notes, "ResourceQuota holds"); got != (want != "") || !strings.Contains(notes, want) {
			t.Errorf("values %q: NOTES.txt\n%s\nwant it to say %q (nothing when empty)", vals, notes, want)
		}
	}
}
