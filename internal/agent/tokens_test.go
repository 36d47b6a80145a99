package agent_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/boxcar-run/boxcar/internal/agent"
)

// withUsage replaces (nil: removes) the usage of a built reply.
func withUsage(r reply, usage any) reply {
	var body map[string]any
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		panic(err)
	}
	delete(body, "usage")
	if usage != nil {
		body["usage"] = usage
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return reply{body: string(b)}
}

// TestTokensCountedWithoutUsage: an endpoint that reports no usage, zeros, negative figures or
// far fewer tokens than its bodies hold (a broken or hostile one saying a token an answer)
// still spends the job's token budget, with an estimate from the bytes sent and received, marked as one in the result, each call and the transcript; so max_tokens (and the
// meter behind a tenant's daily_tokens) stops the job. A plausible report is counted as is, its
// total no less than its parts.
func TestTokensCountedWithoutUsage(t *testing.T) {
	tests := []struct {
		name          string
		usage         any // nil: none in the answer
		wantEstimated bool
	}{
		{name: "usage left out", usage: nil, wantEstimated: true},
		{name: "usage of zeros", usage: map[string]any{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, wantEstimated: true},
		{name: "usage null", usage: json.RawMessage("null"), wantEstimated: true},
		{name: "negative usage", usage: map[string]any{"prompt_tokens": -100000, "completion_tokens": 0, "total_tokens": -100000}, wantEstimated: true},
		{name: "negative prompt tokens", usage: map[string]any{"prompt_tokens": -1000, "completion_tokens": 1001, "total_tokens": 1}, wantEstimated: true},
		{name: "a token an answer", usage: map[string]any{"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}, wantEstimated: true},
		{name: "a few tokens an answer", usage: map[string]any{"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, wantEstimated: true},
		{name: "total below its parts", usage: map[string]any{"prompt_tokens": 1500, "completion_tokens": 500, "total_tokens": 1}},
		{name: "plausible usage", usage: map[string]any{"prompt_tokens": 400, "completion_tokens": 100, "total_tokens": 500}},
		// Each figure counts at most 2^32: summed as reported, they wrapped.
		{name: "figures of 2^63-1", usage: map[string]any{"prompt_tokens": int64(math.MaxInt64), "completion_tokens": int64(math.MaxInt64), "total_tokens": int64(math.MaxInt64)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replies := make([]reply, 0, 50)
			for i := range cap(replies) {
				replies = append(replies, withUsage(toolCalls(0, call{"c" + strings.Repeat("x", i%3) + string(rune('a'+i%26)), "emit", `{"text":"a"}`}), tt.usage))
			}
			s := newScript(t, replies...)
			p := csvProfile(t, emitTool)
			p.Limits.MaxTokens = 2000
			p.Limits.MaxTurns, p.Limits.MaxToolCalls = 50, 50
			m := &meter{allowed: 100}
			req := request(p, newFakeSandbox(nil))
			req.Meter = m
			res, err := newAgent(t, s).Run(context.Background(), req)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.Outcome != agent.OutcomeCapped || res.Cap != agent.CapMaxTokens {
				t.Fatalf("outcome %q cap %q after %d turns, %d tokens; want capped at max_tokens", res.Outcome, res.Cap, res.Turns, res.Usage.TotalTokens)
			}
			if res.Usage.Estimated != tt.wantEstimated || res.Spent.Tokens < 2000 || res.Spent.Tokens != res.Usage.TotalTokens {
				t.Errorf("usage %+v, spent %+v; want estimated %v and at least 2000 tokens spent", res.Usage, res.Spent, tt.wantEstimated)
			}
			var spent int64
			for _, n := range m.spent {
				spent += n
			}
			if spent != res.Usage.TotalTokens {
				t.Errorf("the meter was spent %d tokens, the run counted %d", spent, res.Usage.TotalTokens)
			}
			for _, c := range res.Calls {
				if c.Usage.Estimated != tt.wantEstimated || c.Usage.TotalTokens <= 1 || c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
					t.Errorf("call %d: usage %+v; want estimated %v and its parts summed", c.Turn, c.Usage, tt.wantEstimated)
				}
			}
			n := 0
			for _, l := range transcriptLines(t, res.Transcript) {
				if l["type"] != "response" {
					continue
				}
				n++
				u, _ := l["usage"].(map[string]any)
				if est, _ := u["estimated"].(bool); est != tt.wantEstimated {
					t.Errorf("transcript response line's usage %v; want estimated %v", u, tt.wantEstimated)
				}
			}
			if n != res.Turns {
				t.Errorf("%d response lines for %d turns", n, res.Turns)
			}
		})
	}
}

// TestEstimateCountsDenseText: an answer without usage counts an estimate of what its request
// held, and a request that sends back a tool's output of base64 or hex (a file the job read,
// a digest, an encoded blob) costs far more tokens than a token for 4 bytes: the common
// tokenizers cut such runs into pieces of 2 or 3 characters, and text beyond ASCII into about
// a token a character. Counted at 4 bytes a token, a job reading back base64 spent a third
// to a half more than its max_tokens (and its tenant's daily_tokens) said before it was
// stopped. The estimate of the request that carries the output counts at least a token for
// 2.5 bytes of such a run, a token for each character beyond ASCII.
func TestEstimateCountsDenseText(t *testing.T) {
	blob := make([]byte, 9000)
	for i := range blob {
		blob[i] = byte(i*7919 + i/13)
	}
	tests := []struct {
		name string
		file string
		// dense is the fewest tokens the file's text costs in the request that carries it,
		// and how many of the request's bytes that text is: the rest costs a token for 4.
		dense func(sent []byte) (tokens, bytes int64)
	}{
		{"base64", base64.StdEncoding.EncodeToString(blob), denseTokens},
		{"hex", hex.EncodeToString(blob[:6000]), denseTokens},
		{"beyond ASCII", strings.Repeat("数据分析报告。", 700), func(sent []byte) (tokens, bytes int64) {
			for _, r := range string(sent) {
				if r > unicode.MaxASCII {
					tokens, bytes = tokens+1, bytes+int64(utf8.RuneLen(r))
				}
			}
			return tokens, bytes
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, withUsage(toolCalls(0, call{"r1", "read_file", `{"path": "blob.txt"}`}), nil), withUsage(final("done"), nil))
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), newFakeSandbox(map[string]string{"blob.txt": tt.file})))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			got := s.requests()
			if len(got) != 2 || len(res.Calls) != 2 {
				t.Fatalf("%d requests, %d calls; want 2", len(got), len(res.Calls))
			}
			dense, bytes := tt.dense(got[1].raw)
			if dense < 2000 {
				t.Fatalf("the request carries %d tokens of the file; the test wants thousands", dense)
			}
			want := dense + (int64(len(got[1].raw))-bytes)/4
			if u := res.Calls[1].Usage; !u.Estimated || u.PromptTokens < want {
				t.Errorf("the request of %d bytes carrying the file is estimated %d prompt tokens (estimated %v); want at least %d",
					len(got[1].raw), u.PromptTokens, u.Estimated, want)
			}
		})
	}
}

// denseTokens is the fewest tokens the base64 and hex runs of sent cost, a token for 2.5
// bytes, and how many bytes they are.
func denseTokens(sent []byte) (tokens, bytes int64) {
	for _, run := range regexp.MustCompile(`[A-Za-z0-9+/=]{64,}`).FindAll(sent, -1) {
		tokens, bytes = tokens+int64(len(run))*2/5, bytes+int64(len(run))
	}
	return tokens, bytes
}
