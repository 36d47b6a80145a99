package agent

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
)

// sentOf is body as the middleware keeps a request's, with the number of times it was read.
func sentOf(body []byte, length int64, reads *int) sentBody {
	return sentBody{length: length, get: func() (io.ReadCloser, error) {
		*reads++
		return io.NopCloser(bytes.NewReader(body)), nil
	}}
}

// TestCountUsageReadsTheRequestOnlyWhenItMatters: a report that the request's length alone
// makes plausible is believed without the request's body being counted (it was streamed on
// every request: 5 ms a MiB); one below that bound, absent or negative counts it, and the
// result is what counting it always gave.
func TestCountUsageReadsTheRequestOnlyWhenItMatters(t *testing.T) {
	// A MiB of base64 (a file read back): about 524,288 tokens at 2 bytes a token; plain,
	// the length bound says at most 1,048,578.
	body := []byte(strings.Repeat("QUJD", 1<<18))
	var got textCost
	_, _ = got.Write([]byte(`{"choices":[{"message":{"content":"done"}}]}`))
	estimate := sentBody{length: int64(len(body)), get: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(body)), nil
	}}.cost().tokens() + got.tokens()
	tests := []struct {
		name      string
		total     int64
		length    int64 // the request's ContentLength: -1 unknown
		wantReads int
		wantEst   bool
	}{
		{name: "plausible by the length alone", total: 200_000, length: int64(len(body)), wantReads: 0},
		{name: "plausible, length unknown", total: 200_000, length: -1, wantReads: 1},
		{name: "below the length's bound, plausible by the count", total: estimate / plausibleShare, length: int64(len(body)), wantReads: 1},
		{name: "below the count's bound", total: estimate/plausibleShare - 1, length: int64(len(body)), wantReads: 1, wantEst: true},
		{name: "no usage", total: 0, length: int64(len(body)), wantReads: 1, wantEst: true},
		{name: "negative", total: -5, length: int64(len(body)), wantReads: 1, wantEst: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reads := 0
			u := countUsage(openai.CompletionUsage{PromptTokens: tt.total, TotalTokens: tt.total}, sentOf(body, tt.length, &reads), got)
			if reads != tt.wantReads || u.Estimated != tt.wantEst {
				t.Errorf("request read %d times, estimated %v; want %d, %v", reads, u.Estimated, tt.wantReads, tt.wantEst)
			}
			if tt.wantEst && u.TotalTokens != estimate {
				t.Errorf("estimate %d tokens, want %d", u.TotalTokens, estimate)
			}
		})
	}
}

// TestSentBoundHoldsTheEstimate: no body counts more tokens than its length's bound, the
// densest included (lone lead bytes beyond ASCII, a token each).
func TestSentBoundHoldsTheEstimate(t *testing.T) {
	for _, body := range []string{"", "a", "ab", "\xc0", strings.Repeat("\xc0", 1000), strings.Repeat("A", 31) + "!" + "xyz",
		strings.Repeat("A", 33) + "!", "é", strings.Repeat("QUJD", 100) + "." + strings.Repeat("\xff", 7)} {
		reads := 0
		s := sentOf([]byte(body), int64(len(body)), &reads)
		if bound, _ := s.bound(); s.cost().tokens() > bound {
			t.Errorf("body %q: estimate %d past the bound %d", body, s.cost().tokens(), bound)
		}
	}
}

// BenchmarkCountUsage: an answer to a request of a MiB, whose usage is plausible (most
// endpoints) against one that reports none, whose request must be counted. Compare the two
// in the same run (go test -bench CountUsage -run '^$' ./internal/agent).
func BenchmarkCountUsage(b *testing.B) {
	body := []byte(strings.Repeat(`{"role":"tool","content":"line of output 0123"},`, 1<<20/48))
	var got textCost
	_, _ = got.Write([]byte(`{"choices":[{"message":{"content":"done"}}]}`))
	for _, bb := range []struct {
		name  string
		usage openai.CompletionUsage
	}{
		{name: "usage plausible", usage: openai.CompletionUsage{PromptTokens: 300_000, CompletionTokens: 10, TotalTokens: 300_010}},
		{name: "usage absent", usage: openai.CompletionUsage{}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			reads := 0
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				countUsage(bb.usage, sentOf(body, int64(len(body)), &reads), got)
			}
		})
	}
}
