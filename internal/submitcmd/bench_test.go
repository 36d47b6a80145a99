package submitcmd

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// BenchmarkSubmitJobs is row 6 of make bench: jobs per second submitted by one
// `submit run --jobs FILE` (reading and checking the file, uploading its one shared input,
// recording each job's queued status and publishing the job), against raw async JetStream
// publishes of the same messages (each job's message and its status record) on the same
// server, measured in the same run. ratio_to_raw is submit's rate over raw's; the target is at
// least 0.5, and at least 200 jobs/s. ratio_to_raw_job_msgs compares with the job messages
// alone: the status record is a second message per job, so that ratio stays near 0.5 at best.
// One op is one file of 1000 jobs.
func BenchmarkSubmitJobs(b *testing.B) {
	te := newTestEnvSync(b, false)
	dir := b.TempDir()
	input := filepath.Join(dir, "sales.csv")
	if err := os.WriteFile(input, []byte("region,total\nnorth,3\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	// One op is a file of jobsPerOp jobs, so even -benchtime 1x measures a real batch.
	const jobsPerOp = 1000
	n := jobsPerOp * b.N
	var jobsFile strings.Builder
	for i := range n {
		fmt.Fprintf(&jobsFile, `{"profile":"csv-analyst","task":"Summarise sales.csv, job %d","inputs":[%q],"labels":{"batch":"bench"}}`+"\n", i, input)
	}
	file := filepath.Join(dir, "jobs.jsonl")
	if err := os.WriteFile(file, []byte(jobsFile.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	stream, err := te.js.Stream(b.Context(), "BOXCAR_JOBS_default")
	if err != nil {
		b.Fatal(err)
	}

	// Raw: the same messages (a job with its input, as submit encodes it), each with its id.
	nc, err := nats.Connect(te.natsURL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxInFlight))
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([][]byte, n)
	ids := make([]string, n)
	for i := range n {
		ids[i] = job.NewID()
		j := job.Job{Version: job.Version, ID: ids[i], Profile: "csv-analyst", Task: fmt.Sprintf("Summarise sales.csv, job %d", i),
			Labels: map[string]string{"batch": "bench"}, SubmittedAt: time.Now().UTC(), SubmittedBy: "bench",
			Inputs: []job.Input{{Name: "sales.csv", URI: "file:///x/inputs/sha256/" + strings.Repeat("a", 64), SHA256: strings.Repeat("a", 64), Size: 21}}}
		if msgs[i], err = j.Encode(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// rawPublish sends every job message, and with status also the queued status record
	// submit writes for each (the same two messages submit sends), without waiting per message.
	rawPublish := func(status bool) time.Duration {
		start := time.Now()
		for i := range n {
			if status {
				st := []byte(`{"id":"` + ids[i] + `","state":"queued","profile":"csv-analyst","queued_at":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}`)
				if _, err := js.PublishAsync("$KV.BOXCAR_STATUS_default.default."+ids[i], st, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := js.PublishAsync("boxcar.jobs.default."+ids[i], msgs[i], jetstream.WithMsgID("default."+ids[i]), jetstream.WithExpectStream("BOXCAR_JOBS_default")); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("raw publishes not acknowledged within a minute")
		}
		took := time.Since(start)
		if err := stream.Purge(b.Context()); err != nil {
			b.Fatal(err)
		}
		for i := range ids {
			ids[i] = job.NewID() // the next round's are new messages, not duplicates
		}
		return took
	}
	rawJobs := rawPublish(false)
	raw := rawPublish(true)

	var stdout, stderr bytes.Buffer
	e := &env{getenv: te.getenv, stdout: &stdout, stderr: &stderr, publish: defaultPublishPolicy}
	b.ResetTimer()
	b.StartTimer()
	start := time.Now()
	err = run(b.Context(), e, []string{"run", "--jobs", file})
	took := time.Since(start)
	b.StopTimer()
	if err != nil {
		b.Fatalf("run --jobs: %v\n%s", err, stderr.String())
	}
	if lines := strings.Count(stdout.String(), `"state":"queued"`); lines != n {
		b.Fatalf("%d jobs queued, want %d", lines, n)
	}
	info, err := stream.Info(b.Context())
	if err != nil || int(info.State.Msgs) != n {
		b.Fatalf("stream holds %v jobs (%v), want %d", info.State.Msgs, err, n)
	}
	submitRate := float64(n) / took.Seconds()
	rawRate := float64(n) / raw.Seconds()
	b.ReportMetric(submitRate, "jobs/s")
	b.ReportMetric(rawRate, "raw_jobs/s")
	b.ReportMetric(submitRate/rawRate, "ratio_to_raw")
	b.ReportMetric(submitRate/(float64(n)/rawJobs.Seconds()), "ratio_to_raw_job_msgs")
}
