package runner

import "github.com/boxcar-run/boxcar/internal/queue"

// labelOther is the metric label of a value the worker does not produce itself. A label whose
// value can come from stored or tenant-written data (the reason of a committed manifest someone
// put in the tenant's store, a job's profile: settleMetrics's "unknown") is one of the values
// the worker produces, else this: a value chosen by whoever writes the store or submits would
// otherwise be a new series for the worker's life, one per job.
const labelOther = "other"

// deadLetterReasons are the reasons the worker ends a job with (the failure modes' and
// decide's), the labels boxcar_dead_letters_total takes.
var deadLetterReasons = func() map[string]bool {
	known := map[string]bool{
		"failed": true, "rejected": true, "max_deliveries": true, // decide's defaults
		"report_too_large": true, "network_not_allowed": true, queue.ReasonUnknownTenant: true,
	}
	for _, m := range failureModes {
		if m.reason != "" {
			known[m.reason] = true
		}
	}
	return known
}()

// reasonLabel is a dead letter's reason as a label: an adopted manifest's reason is whatever
// the manifest says.
func reasonLabel(reason string) string {
	if deadLetterReasons[reason] {
		return reason
	}
	return labelOther
}
