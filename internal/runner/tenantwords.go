package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// The steps of an attempt whose failure is the worker's side: their errors wrap what the
// sandbox, the cluster or the store said, which speaks of the host (paths, a node, a pod's
// events, a temporary file), so the tenant is told which step failed and no more
// (tenantWords).
var (
	errSandboxStart = errors.New("start sandbox")
	errInputCopy    = errors.New("copy inputs")
	errEgressAttach = errors.New("attach egress")
	errUpload       = errors.New("upload results")
	errInputMissing = errors.New("input missing")
)

// step is err as a failure of the attempt's step: its text is the step's name, then err's.
func step(which, err error) error { return fmt.Errorf("%w: %w", which, err) }

// toldError is text the tenant was told already (a committed manifest's error, a status's),
// told again as it is.
type toldError struct{ text string }

func (e toldError) Error() string { return e.text }

// tenantWords are the failures the worker records for a job's tenant to read, in its status
// (`submit status`, `watch`), its dead letter, its manifest, its report.md and an end's
// transcript line, first match wins; anything else is told as workerFault. A new failure is a
// new row (docs/lifecycle.md lists them, TestLifecycleDocListsEveryTenantWord). An error's own
// text (own) is made only of what the tenant gave or may read (its job's message, its inputs'
// names, sizes and store URLs, the profile's name and limits, the model endpoint's answer, a
// cap); fixed words never hold the worker's side of the failure.
var tenantWords = wordTable{fallback: workerFault, suffix: toldSuffix, rows: []wordRow{
	{name: "told before", when: is[toldError], own: true},
	{name: "cancelled", when: isErr(errCancelled), own: true},
	{name: "worker shutting down", when: isErr(errShutdown), own: true},
	{name: "deliveries exhausted", when: isErr(errExhausted), own: true},
	{name: "cap", when: is[*capError], own: true},
	{name: "tenant budget spent", when: isErr(errBudgetExhausted), own: true},
	{name: "invalid job", when: isErr(job.ErrInvalid, config.ErrUnknownProfile, config.ErrProfileNotGranted, egress.ErrWiden), own: true},
	{name: "input the job names", when: isErr(errInputTooLarge, errInputMismatch, errInputOutsideTenant), own: true},
	{name: "report too large", when: permanentFor("report_too_large"), own: true},
	{name: "model's answer", when: isErr(agent.ErrModelAuth, agent.ErrModelRequest, agent.ErrModelUnavailable), own: true},

	{name: "sandbox lost over its disk bound", when: func(err error) bool { return lostOverDisk(err, nil) },
		words: "the sandbox passed its disk bound and was evicted: write less, or use a profile with a larger sandbox.disk"},
	{name: "sandbox lost", when: isErr(sandbox.ErrSandboxLost),
		words: "the sandbox went away under the job (evicted, preempted or removed on the worker's side, no fault of the job's)" + triedAgain},
	{name: "started late", when: is[*lateStartError],
		words: "the sandbox (its start, the inputs' copy or its network) was not ready when the run had to start to keep its whole job_timeout, the worker's side too slow" + triedAgain},
	{name: "inputs fill the workdir", when: isErr(sandbox.ErrDiskFull),
		words: "the inputs do not fit the sandbox's workdir: submit smaller inputs, or use a profile with a larger sandbox.disk"},
	{name: "input missing", when: isErr(errInputMissing),
		words: "an input of the job is not in the store (removed since it was submitted): submit the job again, which uploads its inputs"},
	{name: "input refused", when: isErr(store.ErrReadRefused),
		words: "the store refuses the worker reading an input of the job (a policy on its key, or on a file store its file's or folders' mode or owner): tell the operator, who must let the worker read it, then submit the job again"},
	{name: "agent panicked", when: isErr(errAgentPanicked),
		words: "the agent panicked on the job, a bug in the worker: tell its operator the job's id (the worker's log has the stack)"},
	{name: "worker panicked in the end", when: isErr(errEndPanicked),
		words: "the worker panicked recording the job's end, a bug in the worker" + triedAgain + ", the last fails it without a manifest: tell its operator the job's id (the worker's log has the stack)"},
	{name: "worker panicked", when: isErr(errWorkerPanicked),
		words: "the worker panicked on the job, a bug in the worker, which does not try it again: tell its operator the job's id (the worker's log has the stack)"},
	{name: "backend gives no egress", when: isErr(sandbox.ErrNoEgress),
		words: "the profile has a network, but this worker's sandbox backend gives sandboxes none: tell the operator the profile's name"},
	// Before "profile refused": a secret's value unusable as read is the proxy's refusal too.
	{name: "secret unavailable", when: isErr(config.ErrSecretUnavailable, egress.ErrSecretValue),
		words: "a secret of the profile cannot be read or used now; the job is tried again in a minute while it has deliveries left: tell the operator if it goes on"},
	{name: "profile refused", when: isErr(agent.ErrInvalidRequest, egress.ErrInvalidPolicy, egress.ErrInvalidConfig),
		words: "the profile cannot run as it is configured on this worker: tell the operator the profile's name (worker check-config says why)"},
	{name: "store refuses the run's writes", when: func(err error) bool { return errors.Is(err, errUpload) && errors.Is(err, store.ErrWriteRefused) },
		words: "the store refused the worker's writes of the run under the tenant's folder, so the run could not be kept: tell the operator, who must let the worker's credentials write there, then submit the job again"},
	{name: "store refuses the tenant's writes", when: isErr(store.ErrWriteRefused),
		words: "the store refuses the worker's writes under the tenant's folder, so no run of the job could be kept, and it was not run: tell the operator, who must let the worker's credentials write there, then submit the job again"},
	{name: "sandbox backend unavailable", when: isErr(sandbox.ErrUnavailable),
		words: "the sandbox backend cannot start a sandbox now (the cluster is down, full or refuses the worker)" + triedAgain},
	{name: "sandbox start", when: isErr(errSandboxStart),
		words: "the sandbox could not be started on the worker's side" + triedAgain + ": tell the operator if it goes on"},
	{name: "input copy", when: isErr(errInputCopy),
		words: "an input could not be copied from the store into the sandbox" + triedAgain},
	{name: "egress attach", when: isErr(errEgressAttach),
		words: "the sandbox's network could not be set up on the worker's side" + triedAgain},
	{name: "upload", when: isErr(errUpload),
		words: "the run's results could not be uploaded to the store" + triedAgain},
	{name: "out of time", when: isErr(context.DeadlineExceeded), words: "the job's time ran out"},
	{name: "stopped", when: isErr(context.Canceled), words: "the job was stopped"},
}}

// triedAgain follows the words of a failure the job may not meet at its next delivery.
const triedAgain = "; the job is tried again while it has deliveries left"

// workerFault is what the tenant reads of a failure no row of tenantWords names.
const workerFault = "a fault on the worker's side, not the job's" + triedAgain

// waitWords follow "waiting for" and what the attempt waits for (the store, NATS, the sandbox
// backend) in the job's status.
const waitWords = ": it does not answer, or cannot take the job now; the job keeps its delivery and goes on once it can" + toldSuffix

// toldSuffix follows every fixed row's words: where the detail is.
const toldSuffix = " (the worker's log has the detail, under the job's id)"

// tenantText is what the job's tenant reads of err: its own text when a row says it is the
// tenant's (own), else the row's fixed words.
func tenantText(err error) (text string, own bool) { return tenantWords.tell(err) }

func isErr(targets ...error) func(error) bool {
	return func(err error) bool { return errIs(targets...)(err, nil) }
}

func is[T error](err error) bool {
	var t T
	return errors.As(err, &t)
}

// permanentFor matches a queue.Permanent with the reason.
func permanentFor(reason string) func(error) bool {
	return func(err error) bool {
		var perm *queue.PermanentError
		return errors.As(err, &perm) && perm.Reason == reason
	}
}
