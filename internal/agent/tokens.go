package agent

import "github.com/openai/openai-go/v3"

// The token budgets (max_tokens, a tenant's daily_tokens) count what the endpoint reports in
// an answer's usage. An endpoint that leaves usage out, or reports zeros (many self-hosted
// servers do), or negative figures would make turns free and no budget would ever stop the
// job. So such an answer counts an estimate from the bytes of its request and answer bodies
// instead, marked as one (Usage.Estimated) in the transcript, the manifest and the metrics.
// A positive report is believed: without the model's tokenizer no bound on it is both safe
// and never wrong for an honest endpoint.

// estimateBytesPerToken is the estimate's rate: about what English text and JSON cost with the
// common tokenizers.
const estimateBytesPerToken = 4

// countUsage is what one answer costs the budgets: the endpoint's report when it is one, an
// estimate from the sent and got body bytes when not.
func countUsage(reported openai.CompletionUsage, sent, got int64) Usage {
	u := Usage{PromptTokens: reported.PromptTokens, CompletionTokens: reported.CompletionTokens, TotalTokens: reported.TotalTokens}
	if u.TotalTokens == 0 {
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
	}
	if u.TotalTokens > 0 && u.PromptTokens >= 0 && u.CompletionTokens >= 0 {
		return u
	}
	prompt, completion := ceilDiv(sent, estimateBytesPerToken), ceilDiv(got, estimateBytesPerToken)
	return Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: max(prompt+completion, 1), Estimated: true}
}

func ceilDiv(n, d int64) int64 { return (max(n, 0) + d - 1) / d }
