package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/textcut"
)

// What report.md holds when it is not the job's report file (provenance.Collected.Report).
const (
	fromFinalMessage = "final_message"
	fromSummary      = "summary"
	fromNothing      = "none"
)

// collection is what collect took out of the sandbox: the run's files, what it left out, and
// the run's outcome, which a report too large to keep turns into a failure.
type collection struct {
	outs      []output
	collected provenance.Collected
	outcome   outcome
}

// collect reads the report and the artifacts out of the sandbox and returns the run's files
// and its outcome, which a report too large to keep turns into a failure (report_too_large).
//
// Nothing the job left in its workdir fails the run: a report file that is missing or is not
// a regular file inside the workdir (a symlink leading out, a FIFO, a socket, a folder, a
// loop) gives way to the model's final message, recorded as report_unreadable; an artifact or
// folder that cannot be read is left out and named. A run that did not succeed gets the
// worker's account of it at the head of report.md (summaryReport). What collect took and
// what not goes to the collection's collected, for the manifest. err is only ever the
// context's, or the sandbox's loss (sandbox.ErrSandboxLost): a worker shutting down does not
// commit half a collection, and a run whose sandbox went away left nothing to collect.
func (r *Runner) collect(ctx context.Context, a *attempt, sb sandbox.Sandbox, run ran, o outcome) (collection, error) {
	var c provenance.Collected
	body, from, err := r.readReport(ctx, a, sb, run.result.FinalMessage, &c)
	if err != nil {
		return collection{}, err
	}
	if from == fromNothing {
		o = o.withDroppedReport(queue.Permanent("report_too_large", fmt.Errorf("report %s is larger than %d bytes and was not uploaded; write a shorter report and put large output in %s/", a.profile.Report, maxReportBytes, a.profile.Artifacts)))
	}

	artifacts, err := r.collectArtifacts(ctx, a, sb, &c)
	if err != nil {
		return collection{}, err
	}

	var outs []output
	state := decide(o, a.d.LastAttempt()).state
	switch {
	case from == fromNothing:
	case state != job.StateSucceeded || len(body) == 0:
		// Made at the commit, which may leave out more artifacts than collect did.
		bodyFrom := from
		outs = append(outs, output{name: reportName, render: func(cc provenance.Collected) []byte {
			return summaryReport(a, run, cc, state, o, body, bodyFrom)
		}})
		from = fromSummary
	default:
		outs = append(outs, memOutput(reportName, body))
	}
	if from != "" {
		c.Report = from
	}
	return collection{outs: append(outs, artifacts...), collected: c, outcome: o}, nil
}

// readReport reads the profile's report file; without a usable one the report is the model's
// final message (from says so). from is fromNothing when the file is too large to keep. Why
// the file was not used goes to c.
func (r *Runner) readReport(ctx context.Context, a *attempt, sb sandbox.Sandbox, final string, c *provenance.Collected) (body []byte, from string, err error) {
	report, err := sb.ReadFile(ctx, a.profile.Report, maxReportBytes)
	switch {
	case err == nil:
		return report, "", nil
	case ctx.Err() != nil, errors.Is(err, sandbox.ErrSandboxLost):
		return nil, "", fmt.Errorf("read report %s: %w", a.profile.Report, err)
	case errors.Is(err, sandbox.ErrNotFound):
		return finalAsReport(final), fromFinalMessage, nil
	case errors.Is(err, sandbox.ErrTooLarge):
		c.ReportReason, c.ReportError = "report_too_large", fileProblem(err)
		a.log.WarnContext(ctx, "report too large; committing the run without it", "report", a.profile.Report, "max_bytes", maxReportBytes, "error", err)
		return nil, fromNothing, nil
	}
	c.ReportReason, c.ReportError = "report_unreadable", fileProblem(err)
	a.log.WarnContext(ctx, "report file is not a regular file inside the workdir; the model's final message is the report",
		"report", a.profile.Report, "error", err)
	return finalAsReport(final), fromFinalMessage, nil
}

// finalAsReport is the model's final message as the report, bounded as a report file is
// (maxReportBytes): the agent lets an answer be up to its response bound, several times that.
// A longer message keeps its head and says where it was cut.
func finalAsReport(final string) []byte {
	if len(final) <= maxReportBytes {
		return []byte(final)
	}
	marker := fmt.Sprintf("\n\n[the model's final message is %d bytes; cut here at the report's bound of %d]\n", len(final), maxReportBytes)
	return append([]byte(textcut.Head(final, maxReportBytes-len(marker))), marker...)
}

// maxSkippedNamed bounds how many left-out files and folders the manifest names: a job can
// make any number of them.
const maxSkippedNamed = 64

// maxNamedPath bounds a left-out name as the manifest records it, and maxSkipDetail the words
// saying why: the job chooses its paths, up to PATH_MAX and beyond, and an error's text may
// repeat them.
const (
	maxNamedPath  = 256
	maxSkipDetail = 512
)

// skip records a file or folder of the artifact folder that is not uploaded, whatever the
// reason: the one place a skip is recorded, so every path and detail the manifest holds is cut
// to its bound here.
func skip(c *provenance.Collected, path, reason, detail string) {
	if len(c.Skipped) == maxSkippedNamed {
		c.SkippedMore++
		return
	}
	c.Skipped = append(c.Skipped, provenance.Skipped{
		Path: sandbox.ShortPath(path, maxNamedPath), Reason: reason, Detail: sandbox.ShortPath(detail, maxSkipDetail),
	})
}
