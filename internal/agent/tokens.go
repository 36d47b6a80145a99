package agent

import "github.com/openai/openai-go/v3"

// The token budgets (max_tokens, a tenant's daily_tokens) count what the endpoint reports in
// an answer's usage. An endpoint that leaves usage out, or reports zeros (many self-hosted
// servers do), negative figures, or far fewer tokens than its request and answer bodies hold
// (a broken one, or a hostile one saying a token an answer) would make turns free, or nearly,
// and no budget would ever stop the job. So such an answer counts an estimate from the bytes
// of its request and answer bodies instead, marked as one (Usage.Estimated) in the
// transcript, the manifest and the metrics.
//
// Without the model's tokenizer no exact bound on a report is safe, so the bound is loose:
// a report is believed down to a token for plausibleBytesPerToken bytes, eight times fewer
// tokens than the estimate. Text costs about 4 bytes a token with the common tokenizers, and
// the JSON around it (the message structure, escapes, the tool schemas) only adds bytes, so an
// honest endpoint stays far above the bound; one below it is treated as one that reported
// nothing, and counting the estimate rather than the bound leaves nothing to gain by lying.

// estimateBytesPerToken is the estimate's rate: about what English text and JSON cost with the
// common tokenizers.
const estimateBytesPerToken = 4

// plausibleBytesPerToken is the fewest tokens a report may say the bodies held: a token for
// this many of their bytes. Below it the report is not believed.
const plausibleBytesPerToken = 8 * estimateBytesPerToken

// maxReportedTokens is the most tokens a figure of a report counts: thousands of times any
// model's context window, and small enough that no sum of figures, a job's over its turns and
// attempts or a tenant's over its day, can pass what an int64 holds. Believed as sent, a report
// of 2^63-1 wrapped a job's spending negative on top of an earlier attempt's, and max_tokens
// never stopped it.
const maxReportedTokens = 1 << 32

// countUsage is what one answer costs the budgets: the endpoint's report when it is a
// plausible one (its total no less than its parts, each figure at most maxReportedTokens), an
// estimate from the sent and got body bytes when not.
func countUsage(reported openai.CompletionUsage, sent, got int64) Usage {
	prompt, completion := min(reported.PromptTokens, maxReportedTokens), min(reported.CompletionTokens, maxReportedTokens)
	u := Usage{PromptTokens: prompt, CompletionTokens: completion,
		TotalTokens: max(min(reported.TotalTokens, maxReportedTokens), prompt+completion)}
	if plausible(u, sent+got) {
		return u
	}
	prompt, completion = ceilDiv(sent, estimateBytesPerToken), ceilDiv(got, estimateBytesPerToken)
	return Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: max(prompt+completion, 1), Estimated: true}
}

// plausible reports whether u may be what bodies of that many bytes cost: no negative figure,
// and at least a token for plausibleBytesPerToken bytes.
func plausible(u Usage, bytes int64) bool {
	return u.PromptTokens >= 0 && u.CompletionTokens >= 0 && u.TotalTokens > 0 &&
		u.TotalTokens >= bytes/plausibleBytesPerToken
}

func ceilDiv(n, d int64) int64 { return (max(n, 0) + d - 1) / d }
