package bench_test

import (
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/demomodel"
)

const memoryRig = `
profiles:
  p:
    model: {name: bench-model}
    tools: [{name: read_file}]
`

const heldProfile = `  p:
    model: {name: bench-model}
    tools: [{name: read_file}]
`

// artifactProfile writes a report and then 64 MiB of artifacts with dd inside the sandbox, so
// that the worker's memory sees only what it does with the files.
const artifactProfile = `  p:
    model: {name: bench-model}
    sandbox: {disk: 256Mi}
    tools:
      - name: write_file
      - name: fill
        description: 64 MiB of zeros in artifacts/zeros.bin.
        parameters: {type: object, properties: {}, additionalProperties: false}
        command: [dd, if=/dev/zero, of=artifacts/zeros.bin, bs=1M, count=64, status=none]
    limits: {command_timeout: 60s}
`

var artifactScript = [][]demomodel.Call{
	{{Name: "write_file", Args: map[string]any{"path": "report.md", "content": "# 64 MiB of zeros\n"}},
		{Name: "write_file", Args: map[string]any{"path": "artifacts/README", "content": "zeros.bin is all zeros\n"}}},
	{{Name: "fill", Args: map[string]any{}}},
}

const mib = 1 << 20

// BenchmarkWorkerMemory is row 4: the resident set (VmRSS from /proc) of a real worker process
// (the test binary running workercmd, as cmd/worker does) per job in flight, with 1 and then
// 50 jobs parked in their first model call, each over its bubblewrap sandbox, against the same
// worker idle; and the peak resident set (VmHWM, reset before the job) that one job leaving
// 64 MiB of artifacts adds to a second, idle worker. There is no primitive to compare with:
// the targets are absolute (2 MiB a job, 8 MiB for the artifact job).
func BenchmarkWorkerMemory(b *testing.B) {
	rg := newRig(b, memoryRig)
	dir := searchableDir(b)
	held := &scriptedModel{}
	g := newGate()
	held.hold = g.hold
	heldURL := held.start(b)
	filler := &scriptedModel{script: artifactScript}
	fillerURL := filler.start(b)

	var at1, at50, artifact, idle float64
	for range b.N {
		w := startWorker(b, dir, "held", workerConfig(rg, "held", dir, heldURL, 50, "", heldProfile))
		rss0 := w.settled(b)
		g.close()
		ids := rg.publishIDs(b, "p", 1)
		g.await(b, 1, time.Minute)
		rss1, _ := w.memory(b)
		ids = append(ids, rg.publishIDs(b, "p", 49)...)
		g.await(b, 49, 2*time.Minute)
		rss50, _ := w.memory(b)
		g.open()
		rg.awaitEnded(b, ids, 2*time.Minute)
		w.stop(b)

		w = startWorker(b, dir, "filler", workerConfig(rg, "filler", dir, fillerURL, 1, "", artifactProfile))
		before := w.settled(b)
		w.resetPeak(b)
		rg.awaitEnded(b, rg.publishIDs(b, "p", 1), 2*time.Minute)
		_, peak := w.memory(b)
		w.stop(b)

		idle += float64(rss0) / mib
		at1 += float64(rss1-rss0) / mib
		at50 += float64(rss50-rss0) / 50 / mib
		artifact += float64(peak-before) / mib
	}
	n := float64(b.N)
	b.ReportMetric(idle/n, "idle-MiB")
	b.ReportMetric(at1/n, "MiB/job-at-1")
	b.ReportMetric(at50/n, "MiB/job-at-50")
	b.ReportMetric(artifact/n, "artifact-MiB")
}
