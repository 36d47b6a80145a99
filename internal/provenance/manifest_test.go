package provenance_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gowebpki/jcs"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func build(t *testing.T, m provenance.Manifest, subjects []provenance.Subject) []byte {
	t.Helper()
	data, err := provenance.Build(m, subjects)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestBuildParseRoundTrip(t *testing.T) {
	minimal := provenance.Manifest{
		Job:     provenance.Job{ID: jobID, Profile: "p", Task: "t", SubmittedAt: time.Unix(0, 0)},
		Profile: provenance.Profile{Name: "p", Spec: config.Profile{Model: config.ModelParams{Name: "m"}}},
		Outcome: provenance.Outcome{State: "failed", Error: "sandbox: start: no bwrap"},
	}
	tests := []struct {
		name     string
		manifest provenance.Manifest
		subjects []provenance.Subject
	}{
		{"full run", sampleManifest(t), sampleSubjects()},
		{"minimal failed run", minimal, []provenance.Subject{{Name: "transcript.jsonl", SHA256: sha(""), Size: 0}}},
		{"run in an attempt folder", sampleManifest(t), []provenance.Subject{
			{Name: "report.md", SHA256: sha("report"), Size: 6, Path: "attempts/2-0a1b2c3d/report.md"},
			{Name: "transcript.jsonl", SHA256: sha("transcript"), Size: 10, Path: "attempts/2-0a1b2c3d/transcript.jsonl"},
		}},
		{"failed run without a report", withoutReport(t), []provenance.Subject{
			{Name: "transcript.jsonl", SHA256: sha("transcript"), Size: 10},
			{Name: "artifacts/totals.csv", SHA256: sha("totals"), Size: 6},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := build(t, tt.manifest, tt.subjects)
			st, err := provenance.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			wantSubjects := slices.Clone(tt.subjects)
			slices.SortFunc(wantSubjects, func(a, b provenance.Subject) int { return strings.Compare(a.Name, b.Name) })
			if !slices.Equal(st.Subjects, wantSubjects) {
				t.Errorf("subjects = %+v, want %+v", st.Subjects, wantSubjects)
			}
			p := st.Predicate
			if p.Job.ID != tt.manifest.Job.ID || p.Job.Task != tt.manifest.Job.Task || p.Outcome != tt.manifest.Outcome {
				t.Errorf("predicate job/outcome = %+v %+v, want %+v %+v", p.Job, p.Outcome, tt.manifest.Job, tt.manifest.Outcome)
			}
			if !p.Job.SubmittedAt.Equal(tt.manifest.Job.SubmittedAt) {
				t.Errorf("submitted_at = %s, want %s", p.Job.SubmittedAt, tt.manifest.Job.SubmittedAt)
			}
			if want, _ := provenance.ProfileDigest(tt.manifest.Profile.Spec); p.Profile.Digest != want {
				t.Errorf("profile.digest = %s, want %s", p.Profile.Digest, want)
			}
			if got, _ := provenance.ProfileDigest(p.Profile.Spec); got != p.Profile.Digest {
				t.Errorf("the parsed profile spec hashes to %s, the manifest records %s", got, p.Profile.Digest)
			}
			// What Parse returns builds the very same bytes again.
			if again := build(t, p, st.Subjects); !bytes.Equal(again, data) {
				t.Errorf("Build(Parse(m)) differs from m:\n%s\n%s", again, data)
			}
		})
	}
}

// withoutReport is the sample run failed because its report was too large to keep.
func withoutReport(t *testing.T) provenance.Manifest {
	t.Helper()
	m := sampleManifest(t)
	m.Outcome = provenance.Outcome{State: "failed", Reason: "report_too_large", Error: "report report.md is larger than 4194304 bytes"}
	return m
}

func TestBuildKeepsValuesExact(t *testing.T) {
	m := sampleManifest(t)
	st, err := provenance.Parse(build(t, m, sampleSubjects()))
	if err != nil {
		t.Fatal(err)
	}
	p := st.Predicate
	if got := *p.Model.Params.Seed; got != 1<<62+1 {
		t.Errorf("seed = %d, want %d (all digits of an int64)", got, int64(1<<62+1))
	}
	if got := p.Model.EndpointHost; got != "api.example.test" {
		t.Errorf("endpoint_host = %q, want api.example.test", got)
	}
	if got := p.Timings.DurationMS; got != 90_000 {
		t.Errorf("timings.duration_ms = %d, want 90000 computed from started_at and finished_at", got)
	}
	if got := p.Timings.StartedAt.Location(); got != time.UTC {
		t.Errorf("started_at is in %s, want UTC", got)
	}
	if got := p.Limits.MaxTurns; got != 5 {
		t.Errorf("limits.max_turns = %d, want the tightened 5", got)
	}
	if got := p.ToolCalls[2].Approval.DecidedAt; got.Location() != time.UTC || !got.Equal(m.ToolCalls[2].Approval.DecidedAt) {
		t.Errorf("approval.decided_at = %s, want %s in UTC", got, m.ToolCalls[2].Approval.DecidedAt)
	}
	for i := range m.ToolCalls {
		m.ToolCalls[i].Approval.DecidedAt = m.ToolCalls[i].Approval.DecidedAt.UTC()
	}
	if !slices.Equal(p.ToolCalls, m.ToolCalls) {
		t.Errorf("tool_calls = %+v, want %+v", p.ToolCalls, m.ToolCalls)
	}
	if p.Spent != m.Spent {
		t.Errorf("spent = %+v, want %+v", p.Spent, m.Spent)
	}
}

// TestBuildRecordsDecisionsAndSpending pins the JSON of the fields a reader relies on to tell
// who let a shell command through and what earlier attempts spent.
func TestBuildRecordsDecisionsAndSpending(t *testing.T) {
	m := sampleManifest(t)
	m.ToolCalls = append(m.ToolCalls,
		provenance.ToolCall{ID: "call_4", Tool: "shell", ArgsSHA256: sha("4"), ExitCode: -1, Error: "refused: no approval within 5m0s",
			Approval: provenance.Approval{Policy: config.PolicyAsk, Decision: job.DecisionTimedOut, DecidedAt: time.Date(2026, 12, 2, 10, 21, 0, 0, time.UTC)}},
		provenance.ToolCall{ID: "call_5", Tool: "shell", ArgsSHA256: sha("5"),
			Approval: provenance.Approval{Policy: config.PolicyAllowlist, Decision: job.DecisionApproved}},
		provenance.ToolCall{ID: "call_6", Tool: "shell", ArgsSHA256: sha("6"), ExitCode: -1, Error: "refused: the operator's policy for this profile refuses shell commands",
			Approval: provenance.Approval{Policy: config.PolicyDeny, Decision: job.DecisionDenied}},
	)
	data := string(build(t, m, sampleSubjects()))
	tests := []struct {
		name string
		want string
	}{
		{name: "a tool without a policy has no approval", want: `"error":"disk full","exit_code":1,"id":"call_2",`},
		{name: "a person approved, in UTC", want: `"approval":{"decided_at":"2026-12-02T10:16:02.25Z","decided_by":"bob@ops-1","decision":"approved","policy":"ask"},"args_sha256"`},
		{name: "nobody answered", want: `"approval":{"decided_at":"2026-12-02T10:21:00Z","decision":"timed_out","policy":"ask"},`},
		{name: "the allowlist let it through", want: `"approval":{"decision":"approved","policy":"allowlist"},`},
		{name: "the policy refused it", want: `"approval":{"decision":"denied","policy":"deny"},`},
		{name: "spent", want: `"spent":{"all_attempts":{"tokens":2500,"tool_calls":5,"turns":4},"this_attempt":{"tokens":1500,"tool_calls":3,"turns":2}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(data, tt.want) {
				t.Errorf("manifest lacks %s:\n%s", tt.want, data)
			}
		})
	}
	if n := strings.Count(data, `"approval":`); n != 4 {
		t.Errorf("%d approvals in the manifest, want one per shell call (4)", n)
	}
}

func TestBuildIsCanonical(t *testing.T) {
	m := sampleManifest(t)
	base := build(t, m, sampleSubjects())

	// Same run described differently: subjects in another order, times in another zone,
	// the labels map built again.
	other := sampleManifest(t)
	other.Job.SubmittedAt = other.Job.SubmittedAt.In(time.FixedZone("PST", -8*3600))
	other.Timings.StartedAt = other.Timings.StartedAt.UTC()
	other.Job.Labels = map[string]string{"env": "test", "team": "finance"}
	subjects := sampleSubjects()
	slices.Reverse(subjects)
	for i := range 20 {
		if got := build(t, other, subjects); !bytes.Equal(got, base) {
			t.Fatalf("build %d differs:\n%s\n%s", i, got, base)
		}
	}

	// Canonical: compact, keys sorted at every level, no HTML escaping.
	var compact bytes.Buffer
	if err := json.Compact(&compact, base); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(compact.Bytes(), base) {
		t.Errorf("output has insignificant white space: %.200s", base)
	}
	if !bytes.Contains(base, []byte("per <region> & month")) {
		t.Errorf("output escapes HTML characters in the task: %.300s", base)
	}
	checkSortedKeys(t, base)
	for _, want := range []string{
		`{"_type":"https://in-toto.io/Statement/v1","predicate":{`,
		`"predicateType":"https://boxcar.dev/provenance/v1","subject":[{"annotations":{"size":6},"digest":{"sha256":"` + sha("totals") + `"},"name":"artifacts/totals.csv"}`,
		`"seed":4611686018427387905`,
	} {
		if !bytes.Contains(base, []byte(want)) {
			t.Errorf("output lacks %s", want)
		}
	}
}

// TestBuildIsJCS: the manifest is in RFC 8785 canonical form, as gowebpki/jcs computes it,
// also for a task and labels that encoding/json would escape or sort otherwise.
func TestBuildIsJCS(t *testing.T) {
	m := sampleManifest(t)
	m.Job.Task = "Line\u2028separator, paragraph\u2029separator, tab\t, bell\a, \"quoted\" \\ <b>&</b> caf\u00e9 \U0001F600"
	m.Job.Labels = map[string]string{"\uff61": "halfwidth", "\U0001F600": "emoji", "team": "finance"}
	m.Model.Params.Seed = ptr(int64(42)) // JCS has no form for an integer beyond 2^53
	m.Model.Params.Temperature = ptr(0.7)
	m.Model.Params.TopP = ptr(1e-7)
	manifest := build(t, m, sampleSubjects())
	want, err := jcs.Transform(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(manifest, want) {
		i := 0
		for i < len(manifest) && i < len(want) && manifest[i] == want[i] {
			i++
		}
		t.Errorf("the manifest is not JCS; first difference at byte %d:\n got …%.80s\nwant …%.80s", i, manifest[max(i-20, 0):], want[max(i-20, 0):])
	}
	if !bytes.Contains(manifest, []byte("Line\u2028separator")) {
		t.Errorf("U+2028 is not written as itself: %.400s", manifest)
	}
	st, err := provenance.Parse(manifest)
	if err != nil || st.Predicate.Job.Task != m.Job.Task {
		t.Errorf("Parse: task %q, %v; want it back unchanged", st.Predicate.Job.Task, err)
	}
}

// checkSortedKeys walks the JSON tokens and fails on an object whose keys are out of order.
func checkSortedKeys(t *testing.T, data []byte) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		object  bool
		lastKey *string
		wantKey bool
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		top := len(stack) - 1
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top >= 0 && stack[top].object {
					stack[top].wantKey = true
				}
				stack = append(stack, frame{object: v == '{', wantKey: v == '{'})
			default:
				stack = stack[:top]
			}
			continue
		case string:
			if top >= 0 && stack[top].object && stack[top].wantKey {
				if last := stack[top].lastKey; last != nil && *last >= v {
					t.Errorf("key %q follows %q", v, *last)
				}
				stack[top].lastKey = &v
				stack[top].wantKey = false
				continue
			}
		}
		if top >= 0 && stack[top].object {
			stack[top].wantKey = true
		}
	}
}

func TestBuildRejects(t *testing.T) {
	good := sampleManifest(t)
	tests := []struct {
		name     string
		edit     func(m *provenance.Manifest)
		subjects []provenance.Subject
	}{
		{"bad job id", func(m *provenance.Manifest) { m.Job.ID = "../x" }, sampleSubjects()},
		{"no subjects", nil, nil},
		{"climbing subject", nil, []provenance.Subject{{Name: "../../inputs/x", SHA256: sha("x"), Size: 1}}},
		{"absolute subject", nil, []provenance.Subject{{Name: "/etc/passwd", SHA256: sha("x"), Size: 1}}},
		{"subject without digest", nil, []provenance.Subject{{Name: "report.md", Size: 1}}},
		{"uppercase digest", nil, []provenance.Subject{{Name: "report.md", SHA256: strings.ToUpper(sha("x")), Size: 1}}},
		{"negative size", nil, []provenance.Subject{{Name: "report.md", SHA256: sha("x"), Size: -1}}},
		{"climbing path", nil, []provenance.Subject{{Name: "report.md", SHA256: sha("x"), Size: 1, Path: "attempts/../../other/report.md"}}},
		{"absolute path", nil, []provenance.Subject{{Name: "report.md", SHA256: sha("x"), Size: 1, Path: "/etc/passwd"}}},
		{"subject twice", nil, []provenance.Subject{{Name: "report.md", SHA256: sha("x"), Size: 1}, {Name: "report.md", SHA256: sha("y"), Size: 1}}},
		// A run's files are its report, its transcript and its artifacts, in the folder of
		// the attempt that committed, each under its own name: get writes a subject where its
		// name says and reads it where its path says.
		{"a file no run has", nil, []provenance.Subject{{Name: ".git/hooks/post-checkout", SHA256: sha("x"), Size: 1}}},
		{"a file no run has, in an attempt folder", nil, []provenance.Subject{{Name: "manifest.dsse.json", SHA256: sha("x"), Size: 1, Path: "attempts/1-0a1b2c3d/manifest.dsse.json"}}},
		{"the artifacts folder itself", nil, []provenance.Subject{{Name: "artifacts", SHA256: sha("x"), Size: 1}}},
		{"path of another file", nil, []provenance.Subject{{Name: "report.md", SHA256: sha("x"), Size: 1, Path: "attempts/1-0a1b2c3d/artifacts/report.md"}}},
		{"path outside an attempt folder", nil, []provenance.Subject{{Name: "report.md", SHA256: sha("x"), Size: 1, Path: "other/1-0a1b2c3d/report.md"}}},
		{"path of another job's folder", nil, []provenance.Subject{{Name: "report.md", SHA256: sha("x"), Size: 1, Path: "attempts/1-0a1b2c3d/runs/report.md"}}},
		{"two attempt folders", nil, []provenance.Subject{
			{Name: "report.md", SHA256: sha("x"), Size: 1, Path: "attempts/1-0a1b2c3d/report.md"},
			{Name: "transcript.jsonl", SHA256: sha("x"), Size: 1, Path: "attempts/2-0a1b2c3d/transcript.jsonl"},
		}},
		{"bad input digest", func(m *provenance.Manifest) { m.Inputs[0].SHA256 = "abc" }, sampleSubjects()},
		{"bad args digest", func(m *provenance.Manifest) { m.ToolCalls[0].ArgsSHA256 = "args" }, sampleSubjects()},
		{"unknown approval policy", func(m *provenance.Manifest) { m.ToolCalls[2].Approval.Policy = "maybe" }, sampleSubjects()},
		{"unknown approval decision", func(m *provenance.Manifest) { m.ToolCalls[2].Approval.Decision = "ok" }, sampleSubjects()},
		{"a person named for a policy decision", func(m *provenance.Manifest) {
			m.ToolCalls[2].Approval.Policy = config.PolicyAllowlist
		}, sampleSubjects()},
		{"a policy that timed out", func(m *provenance.Manifest) {
			m.ToolCalls[2].Approval = provenance.Approval{Policy: config.PolicyDeny, Decision: job.DecisionTimedOut}
		}, sampleSubjects()},
		{"wrong profile digest", func(m *provenance.Manifest) { m.Profile.Digest = "sha256:" + sha("other") }, sampleSubjects()},
		{"wrong profile digest on ProfileOf's profile", func(m *provenance.Manifest) {
			p, err := provenance.ProfileOf(m.Profile.Name, m.Profile.Spec)
			if err != nil {
				panic(err)
			}
			m.Profile, m.Profile.Digest = p, "sha256:"+sha("other")
		}, sampleSubjects()},
		{"more artifacts than a run holds", nil, withArtifacts(provenance.MaxArtifacts + 1)},
		{"more inputs than a job holds", func(m *provenance.Manifest) { m.Inputs = inputs(provenance.MaxInputs + 1) }, sampleSubjects()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := good
			m.Inputs = slices.Clone(good.Inputs)
			m.ToolCalls = slices.Clone(good.ToolCalls)
			if tt.edit != nil {
				tt.edit(&m)
			}
			if _, err := provenance.Build(m, tt.subjects); !errors.Is(err, provenance.ErrInvalid) {
				t.Errorf("Build error = %v, want ErrInvalid", err)
			}
		})
	}
}

// withArtifacts is a run's transcript and n artifacts.
func withArtifacts(n int) []provenance.Subject {
	subjects := []provenance.Subject{{Name: "transcript.jsonl", SHA256: sha("transcript"), Size: 10}}
	for i := range n {
		subjects = append(subjects, provenance.Subject{Name: fmt.Sprintf("artifacts/%03d.csv", i), SHA256: sha("a"), Size: 1})
	}
	return subjects
}

// inputs are n inputs of a run.
func inputs(n int) []provenance.Input {
	out := make([]provenance.Input, n)
	for i := range out {
		out[i] = provenance.Input{Name: fmt.Sprintf("%03d.csv", i), SHA256: sha(fmt.Sprint(i)), Size: 1}
	}
	return out
}

func TestParseRejects(t *testing.T) {
	good := string(build(t, sampleManifest(t), sampleSubjects()))
	// The most a run holds parses; one more artifact does not: a manifest a store writer made
	// could name a hundred thousand within its 16 MiB, each one a download (get), a read
	// (verify) and a file written, where a worker names at most MaxArtifacts (on main, Parse
	// took any number).
	most := string(build(t, sampleManifest(t), withArtifacts(provenance.MaxArtifacts)))
	if _, err := provenance.Parse([]byte(most)); err != nil {
		t.Fatalf("Parse of a run with %d artifacts: %v", provenance.MaxArtifacts, err)
	}
	extra := `{"annotations":{"size":1},"digest":{"sha256":"` + sha("a") + `"},"name":"artifacts/zzz.csv"},`
	// The same of inputs: a job holds at most MaxInputs (on main, Parse took any number, each
	// a read for verify).
	m := sampleManifest(t)
	m.Inputs = inputs(provenance.MaxInputs)
	mostInputs := string(build(t, m, sampleSubjects()))
	if _, err := provenance.Parse([]byte(mostInputs)); err != nil {
		t.Fatalf("Parse of a run with %d inputs: %v", provenance.MaxInputs, err)
	}
	extraInput := `"inputs":[{"name":"zzz.csv","sha256":"` + sha("a") + `","size":1},`
	subjects := sampleSubjects()
	for i := range subjects {
		subjects[i].Path = "attempts/1-0a1b2c3d/" + subjects[i].Name
	}
	inFolder := string(build(t, sampleManifest(t), subjects))
	tests := []struct {
		name string
		data string
	}{
		{"not JSON", "manifest"},
		{"empty object", "{}"},
		{"trailing data", good + "{}"},
		{"legacy statement type", strings.Replace(good, "in-toto.io/Statement/v1", "in-toto.io/Statement/v0.1", 1)},
		{"other predicate type", strings.Replace(good, provenance.PredicateType, "https://slsa.dev/provenance/v1", 1)},
		{"no size annotation", strings.Replace(good, `"annotations":{"size":6},`, "", 1)},
		{"climbing subject", strings.Replace(good, `"name":"report.md"`, `"name":"../report.md"`, 1)},
		{"a file no run has", strings.Replace(good, `"name":"report.md"`, `"name":".bashrc"`, 1)},
		{"unknown statement field", strings.Replace(good, `{"_type"`, `{"extra":1,"_type"`, 1)},
		// A second member of one name is read by one decoder and not another (protojson
		// refused it, encoding/json keeps the last): a signed manifest read two ways.
		{"a statement member twice", strings.Replace(good, `{"_type"`, `{"subject":[],"_type"`, 1)},
		{"a member of the predicate twice", strings.Replace(good, `"predicate":{`, `"predicate":{"tool_calls":[],`, 1)},
		// Names no worker takes, which get and verify print and get writes as a file: an
		// escape sequence, a line of its own, a right-to-left override (parsed on main).
		{"an artifact name with an escape", strings.ReplaceAll(good, `artifacts/totals.csv"`, `artifacts/\u001b]0;pwned\u0007.csv"`)},
		{"an artifact name with a newline", strings.ReplaceAll(good, `artifacts/totals.csv"`, `artifacts/a\nverified: ok.csv"`)},
		{"an artifact name with an override", strings.ReplaceAll(good, `artifacts/totals.csv"`, `artifacts/\u202evsc.exe"`)},
		{"an attempt folder with a newline", strings.ReplaceAll(inFolder, `attempts/1-0a1b2c3d/`, `attempts/a\nverified: ok/`)},
		{"nested too deep", strings.Replace(good, `"predicate":{`, `"predicate":{"x":`+strings.Repeat("[", 200)+strings.Repeat("]", 200)+`,`, 1)},
		{"bad job id", strings.Replace(good, `"id":"`+jobID+`"`, `"id":"x"`, 1)},
		{"more artifacts than a run holds", strings.Replace(most, `"subject":[`, `"subject":[`+extra, 1)},
		{"more inputs than a job holds", strings.Replace(mostInputs, `"inputs":[`, extraInput, 1)},
		{"an input without a digest", strings.Replace(good, `"inputs":[{"name":"sales.csv","sha256":"`+sha("sales"), `"inputs":[{"name":"sales.csv","sha256":"../x`, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.data == good {
				t.Fatal("the edit did not change the manifest")
			}
			if _, err := provenance.Parse([]byte(tt.data)); !errors.Is(err, provenance.ErrInvalid) {
				t.Errorf("Parse error = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestProfileDigest(t *testing.T) {
	base := exampleProfile(t)
	want, err := provenance.ProfileDigest(base)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(want) {
		t.Fatalf("ProfileDigest = %q, want sha256:<64 hex>", want)
	}
	// Stable: the same profile parsed again (new maps, new order) hashes the same.
	for range 10 {
		if got, _ := provenance.ProfileDigest(exampleProfile(t)); got != want {
			t.Fatalf("ProfileDigest of the same profile = %s, then %s", want, got)
		}
	}
	// Sensitive: every change shows.
	tests := []struct {
		name string
		edit func(p *config.Profile)
	}{
		{"system prompt", func(p *config.Profile) { p.SystemPrompt += " " }},
		{"model", func(p *config.Profile) { p.Model.Name = "gpt-4.1" }},
		{"temperature", func(p *config.Profile) { p.Model.Temperature = ptr(0.1) }},
		{"seed", func(p *config.Profile) { p.Model.Seed = ptr(int64(7)) }},
		{"memory", func(p *config.Profile) { p.Sandbox.Memory = "1Gi" }},
		{"image", func(p *config.Profile) { p.Sandbox.Image = "/srv/rootfs" }},
		{"limit", func(p *config.Profile) { p.Limits.MaxToolCalls++ }},
		{"tool argv", func(p *config.Profile) { p.Tools[3].Command[1] = "-E" }},
		{"tool schema", func(p *config.Profile) {
			p.Tools[3].Parameters["properties"].(map[string]any)["path"].(map[string]any)["maxLength"] = 201
		}},
		{"tool removed", func(p *config.Profile) { p.Tools = p.Tools[:3] }},
		{"shell policy", func(p *config.Profile) {
			p.Tools = append(p.Tools, config.Tool{Name: "shell", Kind: config.ToolShell, Policy: config.PolicyAsk})
		}},
	}
	seen := map[string]string{want: "base"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := exampleProfile(t)
			tt.edit(&p)
			got, err := provenance.ProfileDigest(p)
			if err != nil {
				t.Fatal(err)
			}
			if prev, ok := seen[got]; ok {
				t.Errorf("digest %s after changing the %s equals the one of %s", got, tt.name, prev)
			}
			seen[got] = tt.name
		})
	}
}

func TestDigest(t *testing.T) {
	tests := []struct {
		name, data, want string
	}{
		{"empty", "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, size, err := provenance.Digest(strings.NewReader(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want || size != int64(len(tt.data)) {
				t.Errorf("Digest = %s, %d; want %s, %d", got, size, tt.want, len(tt.data))
			}
		})
	}
}

func TestEndpointHost(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"user info and path", "https://user:pass@host/v1", "host"},
		{"port and query", "https://api.example.test:8443/v1/?api-key=sk-test-SECRET#frag", "api.example.test:8443"},
		{"bare host", "api.openai.com", "api.openai.com"},
		{"bare host with user info", "user:pass@llm.internal:8000/v1", "llm.internal:8000"},
		{"password with '/' and a bad escape", "https://user:pa/ss%ZZ@llm.internal/v1", "llm.internal"},
		{"ipv6", "http://[::1]:11434/v1", "[::1]:11434"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := provenance.EndpointHost(tt.in); got != tt.want {
				t.Errorf("EndpointHost(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestManifestHoldsNoSecret builds a manifest in a worker whose environment holds the API key
// and whose endpoint URL carries credentials, and looks for them in the output.
func TestManifestHoldsNoSecret(t *testing.T) {
	const secret = "sk-test-SECRET"
	t.Setenv("OPENAI_API_KEY", secret)
	t.Setenv("OPENAI_BASE_URL", "https://user:pass@host/v1")
	m := sampleManifest(t)
	m.Model.EndpointHost = "https://user:pass@host/v1"
	m.Worker = provenance.WorkerInfo("worker-1")
	data := build(t, m, sampleSubjects())
	for _, leak := range []string{secret, "user:pass", "pass@", "host/v1", "OPENAI_API_KEY", "sk-test-QUERY"} {
		if bytes.Contains(data, []byte(leak)) {
			t.Errorf("the manifest contains %q", leak)
		}
	}
	if !bytes.Contains(data, []byte(`"endpoint_host":"host"`)) {
		t.Errorf("endpoint_host is not the bare host: %.400s", data)
	}
}

func TestWorkerInfo(t *testing.T) {
	w := provenance.WorkerInfo("worker-7")
	if w.ID != "worker-7" || w.Version == "" || w.GoVersion != runtime.Version() {
		t.Errorf("WorkerInfo = %+v, want id worker-7, a version and Go %s", w, runtime.Version())
	}
}

func TestWorkerString(t *testing.T) {
	tests := []struct {
		name string
		w    provenance.Worker
		want string
	}{
		{"release", provenance.Worker{Version: "v1.2.0", VCSRevision: "0123456789abcdef0123", GoVersion: "go1.26.8"}, "v1.2.0 (rev 0123456789ab) go1.26.8"},
		{"modified tree", provenance.Worker{Version: "v1.2.0-dirty", VCSRevision: "0123456789abcdef0123", VCSModified: true, GoVersion: "go1.26.8"}, "v1.2.0-dirty (rev 0123456789ab, modified) go1.26.8"},
		{"no vcs stamp", provenance.Worker{Version: "(devel)", GoVersion: "go1.26.8"}, "(devel) go1.26.8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.w.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

// BenchmarkBuild is the manifest every committed run writes, on the worker's per-job path: one
// whose profile Build encodes, and one whose profile was encoded ahead (ProfileOf), as a
// worker's are.
func BenchmarkBuild(b *testing.B) {
	encoded := sampleManifest(b)
	var err error
	if encoded.Profile, err = provenance.ProfileOf(encoded.Profile.Name, encoded.Profile.Spec); err != nil {
		b.Fatal(err)
	}
	for name, m := range map[string]provenance.Manifest{"spec": sampleManifest(b), "profile-of": encoded} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := provenance.Build(m, sampleSubjects()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
