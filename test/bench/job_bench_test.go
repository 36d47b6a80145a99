package bench_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

const jobConfig = `
concurrency: 1
profiles:
  p:
    model: {name: bench-model}
    tools:
      - name: list_files
      - name: write_file
      - name: count
        description: Bytes in a file.
        parameters:
          type: object
          properties: {path: {type: string, pattern: "^[a-z]+[.]md$"}}
          required: [path]
          additionalProperties: false
        command: [wc, -c, "{{path}}"]
    limits: {command_timeout: 20s}
`

// jobScript is 3 turns with 3 tool calls: write the report; list the folder and count the
// report's bytes (one command in the sandbox); answer.
var jobScript = [][]demomodel.Call{
	{{Name: "write_file", Args: map[string]any{"path": "report.md", "content": "# Benchmark\n\nOne line of findings.\n"}}},
	{{Name: "list_files", Args: map[string]any{"path": "."}}, {Name: "count", Args: map[string]any{"path": "report.md"}}},
}

// BenchmarkJobOverhead is row 3: one whole job through the runner (embedded NATS, bubblewrap,
// the file store, the agent against a zero-latency scripted model: 3 turns, 3 tool calls)
// against a plain loop making the same primitive calls in sequence: fetch, sandbox start, the
// same three chat requests (the very bytes the agent sent), write, list and exec in the
// sandbox, read the report back, put report, transcript and manifest, close, double-ack. Jobs
// alternate between the two so a busy machine slows both alike; the medians are reported.
func BenchmarkJobOverhead(b *testing.B) {
	rg := newRig(b, jobConfig)
	model := &scriptedModel{script: jobScript}
	modelURL := model.start(b)
	sandboxes, err := sandbox.NewBubblewrap(sandbox.BubblewrapConfig{Root: searchableDir(b), Logger: discardJSON()})
	if err != nil {
		b.Fatalf("bubblewrap: %v (install it with `make deps-test`)", err)
	}
	st, err := store.NewFile(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	ag, err := agent.New(agent.Config{BaseURL: modelURL, MaxRetries: -1, Logger: discardJSON(), Profiles: rg.cfg.Profiles})
	if err != nil {
		b.Fatal(err)
	}
	r, err := runner.New(runner.Config{
		Worker: rg.cfg, Queue: rg.w, Sandboxes: sandboxes, Store: st, Agent: ag,
		Metrics: metrics.New(), Logger: discardJSON(), ModelEndpoint: modelURL,
	})
	if err != nil {
		b.Fatal(err)
	}
	profile := rg.cfg.Profiles["p"]
	ctx := b.Context()
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	b.Cleanup(client.CloseIdleConnections)

	boxcar := func() time.Duration {
		rg.publish(b, "p", 1)
		start := time.Now()
		d, err := rg.w.Fetch(ctx)
		if err != nil {
			b.Fatal(err)
		}
		r.Handle(ctx, d)
		elapsed := time.Since(start)
		st, err := rg.q.Status(ctx, d.JobID)
		if err != nil || st.State != "succeeded" || st.ToolCalls != 3 {
			b.Fatalf("job %s ended %q with %d tool calls: %s (%v)", d.JobID, st.State, st.ToolCalls, st.Error, err)
		}
		return elapsed
	}

	var bodies [][]byte
	raw := func() time.Duration {
		rg.publishRaw(b, "p", 1)
		start := time.Now()
		msg := rg.rawNext(b)
		id := msg.Headers().Get("Nats-Msg-Id")
		sb, err := sandboxes.Start(ctx, sandbox.Spec{JobID: id, SandboxSpec: profile.Sandbox})
		if err != nil {
			b.Fatal(err)
		}
		var transcript bytes.Buffer
		for i, body := range bodies {
			resp, err := client.Post(modelURL+"/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			answer, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				b.Fatalf("chat request: %d %v", resp.StatusCode, err)
			}
			transcript.Write(answer)
			switch i {
			case 0:
				err = sb.WriteFile(ctx, "report.md", []byte("# Benchmark\n\nOne line of findings.\n"))
			case 1:
				if _, err = sb.List(ctx, "."); err == nil {
					var res sandbox.ExecResult
					res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"wc", "-c", "report.md"}, Timeout: 20 * time.Second, MaxOutputBytes: 8192})
					if err == nil && res.ExitCode != 0 {
						b.Fatalf("wc: exit %d: %s", res.ExitCode, res.Stderr)
					}
				}
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		report, err := sb.ReadFile(ctx, "report.md", 4<<20)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sb.List(ctx, "artifacts"); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			b.Fatal(err)
		}
		manifest, _ := json.Marshal(map[string]any{"job": id, "report": len(report), "transcript": transcript.Len()})
		for _, o := range []struct {
			key  string
			data []byte
		}{{"report.md", report}, {"transcript.jsonl", transcript.Bytes()}} {
			// As the runner commits: create-only, in the attempt's own folder.
			key := store.AttemptPrefix(id, "1-00000000") + o.key
			if err := st.PutIfAbsent(ctx, key, bytes.NewReader(o.data), int64(len(o.data))); err != nil {
				b.Fatal(err)
			}
		}
		if err := st.PutIfAbsent(ctx, store.ManifestKey(id), bytes.NewReader(manifest), int64(len(manifest))); err != nil {
			b.Fatal(err)
		}
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		if err := msg.DoubleAck(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}

	boxcar() // warm up, and record the agent's requests for the baseline to replay
	bodies = model.lastBodies()
	if len(bodies) != 3 {
		b.Fatalf("the agent made %d chat requests; the script has 3 turns", len(bodies))
	}
	raw()
	var tBoxcar, tRaw, over durations
	b.ResetTimer()
	for range b.N {
		x, y := boxcar(), raw()
		tBoxcar, tRaw, over = append(tBoxcar, x), append(tRaw, y), append(over, x-y)
	}
	b.StopTimer()
	b.ReportMetric(ms(tBoxcar.quantile(0.5)), "boxcar-ms/job")
	b.ReportMetric(ms(tRaw.quantile(0.5)), "raw-ms/job")
	b.ReportMetric(ms(over.quantile(0.5)), "overhead-ms/job")
	b.ReportMetric(float64(tBoxcar.quantile(0.5))/float64(tRaw.quantile(0.5)), "x-of-raw")
}
