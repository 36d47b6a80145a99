package main

import (
	"math"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
)

// hpa is the stand-in for the HorizontalPodAutoscaler KEDA would create for the ScaledObject
// and kube-controller-manager would run: no external metrics API serves KEDA's metric here, so
// this computes what the HPA controller (k8s.io/kubernetes/pkg/controller/podautoscaler,
// v1.37) does with it, step for step: GetExternalPerPodMetricReplicas for an AverageValue
// target with the default tolerance, then normalizeDesiredReplicasWithBehaviors (the
// stabilization windows, then the scale-up and scale-down rate policies) between the HPA's
// minReplicas and maxReplicas. The behaviour is the ScaledObject's
// advanced.horizontalPodAutoscalerConfig.behavior with the API server's defaults filled in.
type hpa struct {
	behavior     autoscalingv2.HorizontalPodAutoscalerBehavior
	min, max     int32
	tolerance    float64
	started      bool
	recs         []recommendation
	upEvents     []scaleEvent
	downEvents   []scaleEvent
	now          func() time.Time
	defaultDownS int32
}

type recommendation struct {
	replicas int32
	at       time.Time
}

type scaleEvent struct {
	change int32
	at     time.Time
}

// The API server's defaults for an HPA's behaviour (pkg/apis/autoscaling/v2/defaults.go):
// scale up by 4 pods or 100% per 15 s, whichever is more, without stabilization; scale down
// by up to 100% per 15 s after the window (the controller's --horizontal-pod-autoscaler-
// downscale-stabilization, 300 s, when the object sets none). KEDA sets only the scale-down
// window from the chart's keda.scaleDownStabilizationSeconds.
func newHPA(b *autoscalingv2.HorizontalPodAutoscalerBehavior, minReplicas, maxReplicas int32) *hpa {
	maxPolicy := autoscalingv2.MaxChangePolicySelect
	zero := int32(0)
	h := &hpa{min: minReplicas, max: maxReplicas, tolerance: 0.1, now: time.Now, defaultDownS: 300}
	h.behavior.ScaleUp = &autoscalingv2.HPAScalingRules{
		StabilizationWindowSeconds: &zero, SelectPolicy: &maxPolicy,
		Policies: []autoscalingv2.HPAScalingPolicy{
			{Type: autoscalingv2.PodsScalingPolicy, Value: 4, PeriodSeconds: 15},
			{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15},
		},
	}
	h.behavior.ScaleDown = &autoscalingv2.HPAScalingRules{
		StabilizationWindowSeconds: &h.defaultDownS, SelectPolicy: &maxPolicy,
		Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15}},
	}
	if b != nil {
		copyRules(b.ScaleUp, h.behavior.ScaleUp)
		copyRules(b.ScaleDown, h.behavior.ScaleDown)
	}
	return h
}

func copyRules(from, to *autoscalingv2.HPAScalingRules) {
	if from == nil {
		return
	}
	if from.SelectPolicy != nil {
		to.SelectPolicy = from.SelectPolicy
	}
	if from.StabilizationWindowSeconds != nil {
		to.StabilizationWindowSeconds = from.StabilizationWindowSeconds
	}
	if from.Policies != nil {
		to.Policies = from.Policies
	}
}

// desired is one reconcile of the HPA controller for a target at specReplicas (statusReplicas
// of them created), given the metric's total usage and the per-pod target, both in milli-units.
// It returns the replicas the HPA sets and why.
func (h *hpa) desired(specReplicas, statusReplicas int32, usage, targetPerPod int64) (int32, string) {
	if !h.started { // recordInitialRecommendation
		h.started = true
		h.recs = append(h.recs, recommendation{specReplicas, h.now()})
	}
	switch {
	case specReplicas > h.max:
		return h.max, "above maxReplicas"
	case specReplicas < h.min:
		return h.min, "below minReplicas"
	}
	// GetExternalPerPodMetricReplicas: the ratio is taken against the replicas that exist.
	proposal := statusReplicas
	ratio := float64(usage) / (float64(targetPerPod) * float64(statusReplicas))
	if ratio < 1-h.tolerance || ratio > 1+h.tolerance || math.IsNaN(ratio) {
		proposal = int32(math.Min(math.Ceil(float64(usage)/float64(targetPerPod)), math.MaxInt32))
	}
	stabilized := h.stabilize(specReplicas, proposal)
	out, why := h.limitRate(specReplicas, stabilized)
	if stabilized != proposal && why == "" {
		why = "stabilized"
	}
	if out != specReplicas {
		h.storeEvent(specReplicas, out)
	}
	return out, why
}

// stabilize is stabilizeRecommendationWithBehaviors: the lowest recommendation of the scale-up
// window and the highest of the scale-down window bound the new one.
func (h *hpa) stabilize(current, proposal int32) int32 {
	now := h.now()
	upCutoff := now.Add(-time.Duration(*h.behavior.ScaleUp.StabilizationWindowSeconds) * time.Second)
	downCutoff := now.Add(-time.Duration(*h.behavior.ScaleDown.StabilizationWindowSeconds) * time.Second)
	up, down := proposal, proposal
	kept := h.recs[:0]
	for _, r := range h.recs {
		if r.at.After(upCutoff) {
			up = min(up, r.replicas)
		}
		if r.at.After(downCutoff) {
			down = max(down, r.replicas)
		}
		if r.at.After(upCutoff) || r.at.After(downCutoff) {
			kept = append(kept, r)
		}
	}
	h.recs = append(kept, recommendation{proposal, now})
	return min(max(current, up), down)
}

// limitRate is convertDesiredReplicasWithBehaviorRate with the HPA's bounds.
func (h *hpa) limitRate(current, desired int32) (int32, string) {
	switch {
	case desired > current:
		limit := max(h.ruleLimit(current, h.behavior.ScaleUp, true), current)
		if limit < h.max {
			if desired > limit {
				return limit, "scale-up rate limit"
			}
		} else if desired > h.max {
			return h.max, "maxReplicas"
		}
	case desired < current:
		limit := min(h.ruleLimit(current, h.behavior.ScaleDown, false), current)
		if limit > h.min {
			if desired < limit {
				return limit, "scale-down rate limit"
			}
		} else if desired < h.min {
			return h.min, "minReplicas"
		}
	}
	return desired, ""
}

// ruleLimit is calculateScaleUpLimitWithScalingRules (up) or calculateScaleDownLimitWithBehaviors.
func (h *hpa) ruleLimit(current int32, rules *autoscalingv2.HPAScalingRules, up bool) int32 {
	sel := autoscalingv2.MaxChangePolicySelect
	if rules.SelectPolicy != nil {
		sel = *rules.SelectPolicy
	}
	if sel == autoscalingv2.DisabledPolicySelect {
		return current
	}
	// Max change: the highest limit up, the lowest limit down; Min change the reverse.
	pickHigh := up == (sel != autoscalingv2.MinChangePolicySelect)
	result := int32(math.MinInt32)
	if !pickHigh {
		result = math.MaxInt32
	}
	for _, p := range rules.Policies {
		start := current - h.changed(h.upEvents, p.PeriodSeconds) + h.changed(h.downEvents, p.PeriodSeconds)
		var proposed int32
		switch {
		case up && p.Type == autoscalingv2.PodsScalingPolicy:
			proposed = start + p.Value
		case up:
			proposed = int32(math.Ceil(float64(start) * (1 + float64(p.Value)/100)))
		case p.Type == autoscalingv2.PodsScalingPolicy:
			proposed = start - p.Value
		default:
			proposed = int32(float64(start) * (1 - float64(p.Value)/100))
		}
		if pickHigh {
			result = max(result, proposed)
		} else {
			result = min(result, proposed)
		}
	}
	return result
}

func (h *hpa) changed(events []scaleEvent, periodSeconds int32) int32 {
	cutoff := h.now().Add(-time.Duration(periodSeconds) * time.Second)
	var n int32
	for _, e := range events {
		if e.at.After(cutoff) {
			n += e.change
		}
	}
	return n
}

// storeEvent keeps the change for the rate policies (storeScaleEvent); events older than the
// longest period count for nothing and are dropped.
func (h *hpa) storeEvent(from, to int32) {
	now := h.now()
	prune := func(events []scaleEvent, rules *autoscalingv2.HPAScalingRules) []scaleEvent {
		var longest int32
		for _, p := range rules.Policies {
			longest = max(longest, p.PeriodSeconds)
		}
		cutoff := now.Add(-time.Duration(longest) * time.Second)
		kept := events[:0]
		for _, e := range events {
			if e.at.After(cutoff) {
				kept = append(kept, e)
			}
		}
		return kept
	}
	if to > from {
		h.upEvents = append(prune(h.upEvents, h.behavior.ScaleUp), scaleEvent{to - from, now})
	} else {
		h.downEvents = append(prune(h.downEvents, h.behavior.ScaleDown), scaleEvent{from - to, now})
	}
}
