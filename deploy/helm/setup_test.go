package helm

import (
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// checkSetupJob (issue 23): with natsServer.operatorCredentialsSecret, the chart runs `worker
// setup` as a Helm hook before every install and upgrade, so workers whose NATS credentials
// only bind find the streams: a Job whose args the worker's own flag parsing accepts, with the
// operator's .creds from that Secret (and the workers' TLS files), reading the workers' very
// config from a hook ConfigMap made before it; its pod passes "restricted", has no API token
// and is selected by nothing that selects the workers. Without the Secret, neither exists.
func checkSetupJob(t *testing.T, r *rendered) {
	t.Helper()
	secret, _ := lookup(r.values, "natsServer.operatorCredentialsSecret.name").(string)
	jobs := all[*batchv1.Job](r)
	var hookCM *corev1.ConfigMap
	for _, cm := range all[*corev1.ConfigMap](r) {
		if cm.Name == fullname+"-setup" {
			hookCM = cm
		}
	}
	if secret == "" {
		if len(jobs) != 0 || hookCM != nil {
			t.Errorf("%d Jobs and setup ConfigMap %v without natsServer.operatorCredentialsSecret", len(jobs), hookCM != nil)
		}
		return
	}
	job := one[*batchv1.Job](t, r, fullname+"-setup")
	if hookCM == nil {
		t.Fatal("no setup ConfigMap for the setup Job")
	}
	checkHookOrder(t, hookCM.ObjectMeta, job.ObjectMeta)
	worker := one[*corev1.ConfigMap](t, r, fullname)
	if hookCM.Data["boxcar.yaml"] != worker.Data["boxcar.yaml"] || worker.Data["boxcar.yaml"] == "" {
		t.Errorf("the setup hook's config differs from the workers':\n%s\nworkers':\n%s", hookCM.Data["boxcar.yaml"], worker.Data["boxcar.yaml"])
	}

	pod := job.Spec.Template
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range eval.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec) {
		if !res.Allowed {
			t.Errorf("setup pod violates the restricted Pod Security Standard: %s: %s", res.ForbiddenReason, res.ForbiddenDetail)
		}
	}
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the setup pod mounts an API token; it talks to NATS only")
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || job.Spec.BackoffLimit == nil || job.Spec.ActiveDeadlineSeconds == nil {
		t.Errorf("setup Job restartPolicy %s, backoffLimit %v, deadline %v; want Never, a few tries and a deadline (or the install waits forever)",
			pod.Spec.RestartPolicy, job.Spec.BackoffLimit, job.Spec.ActiveDeadlineSeconds)
	}
	checkNotSelectedAsWorker(t, r, pod.Labels)
	checkSetupNetworkPolicy(t, r, job)

	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("setup pod has %d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "setup" {
		t.Fatalf("setup container args %q, want `worker setup`", c.Args)
	}
	checkWorkerFlags(t, c.Args)
	for _, e := range c.Env {
		if e.Value != "" {
			t.Errorf("setup container env %s has a literal value", e.Name)
		}
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	mounts := map[string]corev1.Volume{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = vols[m.Name]
	}
	flags := map[string]string{}
	for _, a := range c.Args[1:] {
		k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		flags[k] = v
	}
	if v := mounts[path.Dir(flags["config"])]; v.ConfigMap == nil || v.ConfigMap.Name != hookCM.Name {
		t.Errorf("--config=%s is not in the setup ConfigMap %s: %+v", flags["config"], hookCM.Name, v)
	}
	key, _ := lookup(r.values, "natsServer.operatorCredentialsSecret.key").(string)
	creds := flags["nats-creds"]
	v := mounts[path.Dir(creds)]
	if v.Secret == nil || v.Secret.SecretName != secret || len(v.Secret.Items) != 1 ||
		v.Secret.Items[0].Key != key || v.Secret.Items[0].Path != path.Base(creds) {
		t.Fatalf("--nats-creds=%q in volume %+v, want key %s of Secret %s", creds, v, key, secret)
	}
	if m := v.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
		t.Errorf("operator credentials mode %v, want none for others", m)
	}
	checkNATSTLS(t, r, flags, mounts)
}

// checkHookOrder: both are pre-install and pre-upgrade hooks, the ConfigMap made before the Job,
// each replaced at the next run and removed once it succeeded.
func checkHookOrder(t *testing.T, cm, job metav1.ObjectMeta) {
	t.Helper()
	for _, m := range []metav1.ObjectMeta{cm, job} {
		hooks := strings.Split(m.Annotations["helm.sh/hook"], ",")
		if !slices.Contains(hooks, "pre-install") || !slices.Contains(hooks, "pre-upgrade") {
			t.Errorf("%s: helm.sh/hook %q, want pre-install and pre-upgrade", m.Name, m.Annotations["helm.sh/hook"])
		}
		if p := m.Annotations["helm.sh/hook-delete-policy"]; !strings.Contains(p, "before-hook-creation") {
			t.Errorf("%s: hook-delete-policy %q: the next install or upgrade would find it and fail", m.Name, p)
		}
	}
	cw, err1 := strconv.Atoi(cm.Annotations["helm.sh/hook-weight"])
	jw, err2 := strconv.Atoi(job.Annotations["helm.sh/hook-weight"])
	if err1 != nil || err2 != nil || cw >= jw {
		t.Errorf("hook weights: ConfigMap %q, Job %q; the ConfigMap must come first", cm.Annotations["helm.sh/hook-weight"], job.Annotations["helm.sh/hook-weight"])
	}
}

// checkNotSelectedAsWorker: the setup pod is none of the workers: not in the Deployment's
// selector, the metrics Service's, the PodDisruptionBudget's or the worker NetworkPolicy's.
func checkNotSelectedAsWorker(t *testing.T, r *rendered, podLabels map[string]string) {
	t.Helper()
	set := labels.Set(podLabels)
	selectors := map[string]*metav1.LabelSelector{"Deployment": one[*appsv1.Deployment](t, r, fullname).Spec.Selector}
	for _, p := range all[*policyv1.PodDisruptionBudget](r) {
		selectors["PodDisruptionBudget "+p.Name] = p.Spec.Selector
	}
	for _, np := range all[*networkingv1.NetworkPolicy](r) {
		if np.Namespace == releaseNamespace && np.Name != fullname+"-setup" {
			selectors["NetworkPolicy "+np.Name] = &np.Spec.PodSelector
		}
	}
	for what, sel := range selectors {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil || s.Matches(set) {
			t.Errorf("%s selects the setup pod %v (%v)", what, podLabels, err)
		}
	}
	for _, svc := range all[*corev1.Service](r) {
		if labels.SelectorFromSet(svc.Spec.Selector).Matches(set) {
			t.Errorf("Service %s selects the setup pod %v", svc.Name, podLabels)
		}
	}
}

// checkSetupNetworkPolicy: with networkPolicy.enabled, a NetworkPolicy made before the setup Job
// selects its pod, lets nothing in, and lets out only DNS and NATS.
func checkSetupNetworkPolicy(t *testing.T, r *rendered, job *batchv1.Job) {
	t.Helper()
	if on, _ := lookup(r.values, "networkPolicy.enabled").(bool); !on {
		return
	}
	np := one[*networkingv1.NetworkPolicy](t, r, fullname+"-setup")
	checkHookOrder(t, np.ObjectMeta, job.ObjectMeta)
	if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil || sel.Empty() || !sel.Matches(labels.Set(job.Spec.Template.Labels)) {
		t.Errorf("setup NetworkPolicy selector %v does not select the setup pod %v", np.Spec.PodSelector, job.Spec.Template.Labels)
	}
	if len(np.Spec.PolicyTypes) != 2 || len(np.Spec.Ingress) != 0 {
		t.Errorf("setup NetworkPolicy types %v, ingress %+v; want both types and nothing in", np.Spec.PolicyTypes, np.Spec.Ingress)
	}
	cfg := workerConfig(t, r)
	want := []string{"UDP/53", "TCP/53", "TCP/" + urlPort(t, cfg.NATS.URL)}
	var got []string
	for _, rule := range np.Spec.Egress {
		for _, p := range rule.Ports {
			got = append(got, string(*p.Protocol)+"/"+p.Port.String())
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("setup NetworkPolicy lets out %v, want only DNS and NATS %v", got, want)
	}
}
