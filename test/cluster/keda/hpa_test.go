package main

import (
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
)

// The stand-in HPA on the cases the HPA controller's own tests cover, with the clock moved by
// hand: the scale-up rate (4 pods or 100% per 15 s), the bounds, the 10% tolerance and the
// scale-down stabilization window the ScaledObject sets. build.sh runs it when it rebuilds the
// stand-in.
func TestHPA(t *testing.T) {
	window := int32(15)
	now := time.Unix(1_000_000, 0)
	h := newHPA(&autoscalingv2.HorizontalPodAutoscalerBehavior{
		ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: &window},
	}, 1, 10)
	h.now = func() time.Time { return now }
	step := func(d time.Duration, spec, status int32, lag int64, want int32) {
		t.Helper()
		now = now.Add(d)
		if got, why := h.desired(spec, status, lag*1000, 1000); got != want {
			t.Fatalf("at +%s, %d replicas (%d created), lag %d: HPA sets %d (%s), want %d", d, spec, status, lag, got, why, want)
		}
	}
	step(0, 1, 0, 40, 5)               // from KEDA's one replica: at most 1+4 in 15 s
	step(5*time.Second, 5, 5, 40, 5)   // the 4 added in this period still count
	step(11*time.Second, 5, 5, 40, 10) // a new period: 100% of 5, capped at maxReplicas
	step(5*time.Second, 10, 10, 10, 10)
	step(5*time.Second, 10, 10, 11, 10) // 10% over the target: within the tolerance
	step(5*time.Second, 10, 10, 4, 10)  // a lower proposal waits out the 15 s window
	step(11*time.Second, 10, 10, 4, 4)  // the window holds only the 4 now
	step(5*time.Second, 4, 4, 0, 4)
	step(16*time.Second, 4, 4, 0, 1) // minReplicas; KEDA alone goes to zero
}
