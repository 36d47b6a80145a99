package agent

import (
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
)

// The token budgets (max_tokens, a tenant's daily_tokens) count what the endpoint reports in
// an answer's usage. An endpoint that leaves usage out, or reports zeros (many self-hosted
// servers do), negative figures, or far fewer tokens than its request and answer bodies hold
// (a broken one, or a hostile one saying a token an answer) would make turns free, or nearly,
// and no budget would ever stop the job. So such an answer counts an estimate from the bytes
// of its request and answer bodies instead, marked as one (Usage.Estimated) in the
// transcript, the manifest and the metrics.
//
// Without the model's tokenizer no exact bound on a report is safe, so the bound is loose:
// a report is believed down to a plausibleShare of the estimate, eight times fewer tokens. Text costs about 4 bytes a token with the common tokenizers, and
// the JSON around it (the message structure, escapes, the tool schemas) only adds bytes, so an
// honest endpoint stays far above the bound; one below it is treated as one that reported
// nothing, and counting the estimate rather than the bound leaves nothing to gain by lying.

// estimateBytesPerToken is the estimate's rate for text: about what English text and JSON cost
// with the common tokenizers.
const estimateBytesPerToken = 4

// Text the common tokenizers cut finer than English costs more: a run of at least denseRun
// base64 or hex characters (a file the job read back, a digest, an encoded blob) is cut into
// pieces of 2 or 3 characters, and counts a token for denseBytesPerToken of its bytes; a
// character beyond ASCII costs about a token (Chinese, Japanese, emoji), and counts one. At a
// token for 4 bytes, a job reading back base64 spent a third to a half more than max_tokens
// said before it was stopped (TestEstimateCountsDenseText).
const (
	denseRun           = 32
	denseBytesPerToken = 2
)

// plausibleShare is how many times fewer tokens than the estimate a report may say the bodies
// held: below it the report is not believed.
const plausibleShare = 8

// textCost is the estimate of what text costs, counted as its bytes stream past (Write).
type textCost struct {
	plain, dense, wide int64 // bytes of plain text, bytes of dense runs, characters beyond ASCII
	run                int64 // the base64 or hex run the last bytes are part of
}

// Write counts p; it never fails.
func (c *textCost) Write(p []byte) (int, error) {
	for _, b := range p {
		switch {
		case b < utf8.RuneSelf && denseByte[b]:
			c.run++
			continue
		case b >= 0xC0: // the first byte of a character beyond ASCII; the rest count nothing
			c.wide++
		case b < utf8.RuneSelf:
			c.plain++
		}
		c.endRun()
	}
	return len(p), nil
}

func (c *textCost) endRun() {
	if c.run >= denseRun {
		c.dense += c.run
	} else {
		c.plain += c.run
	}
	c.run = 0
}

// tokens is the estimate of what was written so far.
func (c textCost) tokens() int64 {
	c.endRun()
	return ceilDiv(c.plain, estimateBytesPerToken) + ceilDiv(c.dense, denseBytesPerToken) + c.wide
}

// denseByte marks the characters of base64 and hex.
var denseByte = func() (t [utf8.RuneSelf]bool) {
	for _, b := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") {
		t[b] = true
	}
	return t
}()

// maxReportedTokens is the most tokens a figure of a report counts: thousands of times any
// model's context window, and small enough that no sum of figures, a job's over its turns and
// attempts or a tenant's over its day, can pass what an int64 holds. Believed as sent, a report
// of 2^63-1 wrapped a job's spending negative on top of an earlier attempt's, and max_tokens
// never stopped it.
const maxReportedTokens = 1 << 32

// countUsage is what one answer costs the budgets: the endpoint's report when it is a
// plausible one (its total no less than its parts, each figure at most maxReportedTokens), the
// estimate of the sent and got bodies when not. The sent body, the larger, is counted only when
// its bound does not already make the report plausible.
func countUsage(reported openai.CompletionUsage, sent sentBody, got textCost) Usage {
	prompt, completion := min(reported.PromptTokens, maxReportedTokens), min(reported.CompletionTokens, maxReportedTokens)
	u := Usage{PromptTokens: prompt, CompletionTokens: completion,
		TotalTokens: max(min(reported.TotalTokens, maxReportedTokens), prompt+completion)}
	if bound, ok := sent.bound(); ok && plausible(u, bound+got.tokens()) {
		return u
	}
	prompt, completion = sent.cost().tokens(), got.tokens()
	if plausible(u, prompt+completion) {
		return u
	}
	return Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: max(prompt+completion, 1), Estimated: true}
}

// plausible reports whether u may be what bodies estimated at that many tokens cost: no
// negative figure, and at least a plausibleShare of the estimate.
func plausible(u Usage, estimate int64) bool {
	return u.PromptTokens >= 0 && u.CompletionTokens >= 0 && u.TotalTokens > 0 &&
		u.TotalTokens >= estimate/plausibleShare
}

func ceilDiv(n, d int64) int64 { return (max(n, 0) + d - 1) / d }
