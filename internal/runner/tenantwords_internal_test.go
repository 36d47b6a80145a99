package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// hostDetail is what the worker's side says of a failure: a path on its host, a node.
const hostDetail = "open /var/lib/boxcar/sandboxes/boxcar-j-1a2b/work: no such file or directory on node-7.corp.internal"

// tenantWordCases are an error of each row of tenantWords, by the row's name, as the attempt
// meets it: wrapped in the worker's words, hostDetail among them.
var tenantWordCases = map[string]error{
	"told before":                       toldError{"a manifest's error"},
	"cancelled":                         errCancelled,
	"worker shutting down":              errShutdown,
	"deliveries exhausted":              fmt.Errorf("%w in 3 deliveries; the last error: a status's error", errExhausted),
	"cap":                               &capError{cap: "max_turns"},
	"tenant budget spent":               fmt.Errorf("%w: tenant default has spent 10 tokens today", errBudgetExhausted),
	"invalid job":                       fmt.Errorf("%w: inputs[0].sha256 is not 64 hex digits", job.ErrInvalid),
	"input the job names":               fmt.Errorf("input a.csv is not the 3 bytes it names: %w", errInputMismatch),
	"report too large":                  queue.Permanent("report_too_large", errors.New("report report.md is larger than 4194304 bytes")),
	"model's answer":                    fmt.Errorf("%w: the endpoint answered 401 invalid_api_key", agent.ErrModelAuth),
	"sandbox lost over its disk bound":  fmt.Errorf("the run lost its sandbox: %w: %w: %s", sandbox.ErrSandboxLost, sandbox.ErrDiskFull, hostDetail),
	"sandbox lost":                      fmt.Errorf("the run lost its sandbox: %w: %s", sandbox.ErrSandboxLost, hostDetail),
	"started late":                      step(errSandboxStart, fmt.Errorf("%s: %w", hostDetail, &lateStartError{jobTimeout: time.Minute})),
	"inputs fill the workdir":           step(errInputCopy, fmt.Errorf("%s: %w", hostDetail, sandbox.ErrDiskFull)),
	"input missing":                     step(errInputMissing, fmt.Errorf("input a.csv is not in the store: %s: %w", hostDetail, store.ErrNotFound)),
	"input refused":                     fmt.Errorf("input a.csv: %w: AccessDenied on s3://%s", store.ErrReadRefused, hostDetail),
	"agent panicked":                    fmt.Errorf("%w: %s", errAgentPanicked, hostDetail),
	"worker panicked in the end":        fmt.Errorf("%w: in its end stage: %s", errEndPanicked, hostDetail),
	"worker panicked":                   fmt.Errorf("%w: in its commit stage: %s", errWorkerPanicked, hostDetail),
	"backend gives no egress":           fmt.Errorf("profile p has a network: %w", sandbox.ErrNoEgress),
	"secret unavailable":                fmt.Errorf("secret TOKEN from /etc/boxcar/%s: %w", hostDetail, config.ErrSecretUnavailable),
	"profile refused":                   fmt.Errorf("egress of profile p: %s: %w", hostDetail, egress.ErrInvalidPolicy),
	"store refuses the run's writes":    step(errUpload, fmt.Errorf("upload report.md: store: put-if-absent s3://%s/tenants/default/runs/j/attempts/1-a/report.md: AccessDenied (%w)", hostDetail, store.ErrWriteRefused)),
	"store refuses the tenant's writes": fmt.Errorf("check for a committed run: store: %w under s3://%s/tenants/default/: AccessDenied", store.ErrWriteRefused, hostDetail),
	"sandbox backend unavailable":       step(errSandboxStart, fmt.Errorf("%s: %w", hostDetail, sandbox.ErrUnavailable)),
	"sandbox start":                     step(errSandboxStart, errors.New("bubblewrap could not set up the sandbox: Can't find source path "+hostDetail)),
	"input copy":                        step(errInputCopy, errors.New(hostDetail)),
	"egress attach":                     step(errEgressAttach, errors.New(hostDetail)),
	"upload":                            step(errUpload, fmt.Errorf("upload report.md: store: rename /var/lib/boxcar/store/.boxcar-tmp-1: %s", hostDetail)),
	"out of time":                       fmt.Errorf("check the job is still ours: %s: %w", hostDetail, context.DeadlineExceeded),
	"stopped":                           fmt.Errorf("check the job is still ours: %s: %w", hostDetail, context.Canceled),
}

// TestTenantWords: every row of tenantWords gives its error's own text when it is the tenant's,
// else its fixed words, which never hold the worker's side of the failure; an error no row
// names is workerFault. Each row has a case here, and its case no row before it takes.
func TestTenantWords(t *testing.T) {
	t.Parallel()
	for _, w := range tenantWords.rows {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			err, ok := tenantWordCases[w.name]
			if !ok {
				t.Fatalf("no case for the row %q", w.name)
			}
			got, own := tenantText(err)
			switch {
			case own != w.own:
				t.Errorf("tenantText(%v) own = %v, want the row %q's %v (another row took it: %q)", err, own, w.name, w.own, got)
			case w.own && got != err.Error():
				t.Errorf("tenantText = %q, want the error's own text %q", got, err.Error())
			case !w.own && got != w.words+toldSuffix:
				t.Errorf("tenantText = %q, want the row's words %q", got, w.words)
			}
			if !w.own && (strings.Contains(got, "/var/lib") || strings.Contains(got, "node-7")) {
				t.Errorf("the tenant reads the worker's side: %q", got)
			}
		})
	}
	if got := errorText(errors.New(hostDetail)); got != workerFault+toldSuffix {
		t.Errorf("errorText of an error no row names = %q, want workerFault", got)
	}
}

// TestLifecycleDocListsEveryTenantWord holds docs/lifecycle.md's table of what a tenant reads
// of a failure to tenantWords: every fixed row's words are there, so a team finds what its
// job's status means and what to do.
func TestLifecycleDocListsEveryTenantWord(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "lifecycle.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(string(data)), " ")
	words := []string{workerFault, strings.TrimPrefix(waitWords, ": ")}
	for _, w := range tenantWords.rows {
		if !w.own {
			words = append(words, w.words)
		}
	}
	for _, w := range words {
		if !strings.Contains(doc, strings.TrimSuffix(w, toldSuffix)) {
			t.Errorf("docs/lifecycle.md does not list the words %q", w)
		}
	}
}

// TestInputRefusedWordsFitEveryStore: a file store refuses the worker an input by its file's or
// folders' mode or owner (File.readRefusedWhere), input_refused as S3's policy on its key is,
// and the tenant's words name both. Before, they said "a policy on its key" and "the worker's
// credentials" for a file's mode.
func TestInputRefusedWordsFitEveryStore(t *testing.T) {
	t.Parallel()
	got, _ := tenantText(fmt.Errorf("input a.csv: %w: openat tenants/t/inputs/sha256/ab: permission denied", store.ErrReadRefused))
	if !strings.Contains(got, "a policy on its key") || !strings.Contains(got, "mode") || strings.Contains(got, "credentials") {
		t.Errorf("tenantText = %q; want a policy on its key and a file's mode named, no credentials alone", got)
	}
}
