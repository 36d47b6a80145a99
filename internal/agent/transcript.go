package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The transcript is JSONL, one object per event, each with "type" and "time":
//
//	{"type":"request","turn":1,"params":{…},"messages":[…]}  params (model, parameters, tools)
//	    on the first request only; messages are those added since the previous request
//	{"type":"response","turn":1,"id":…,"model":…,"finish_reason":…,"usage":{…},"message":{…},"duration_ms":…}
//	{"type":"tool_call","turn":1,"id":…,"tool":…,"args":…,"argv":[…],"result":{…},"exit_code":…,
//	    "timed_out":…,"truncated":…,"duration_ms":…,"approval_ms":…,"exec_ms":…,
//	    "stdout":{"bytes":…,"sha256":…},"stderr":{…},"error":…}
//	    result holds the complete output as the sandbox returned it, before the model's cap.
//	    argv is the command as run or as refused (command tools and shell); exec_ms (the
//	    command's run time as the sandbox measured it) and the stdout/stderr digests (SHA-256
//	    of each stream as the sandbox captured it) are there when a command ran; duration_ms
//	    is the whole call, approval_ms the part spent waiting for a person (shell, "ask")
//	{"type":"not_run","turn":1,"calls":…,"error":…}
//	    an answer's calls that did not run (a cap) each have a tool_call line whose error starts
//	    "not run", up to 16 of them; this line counts the rest
//	{"type":"final","outcome":…,"cap":…,"message":…,"turns":…,"tool_calls":…,"usage":{…},
//	    "spent":{"turns":…,"tool_calls":…,"tokens":…},"error":…}
//	    spent is the job's budget used, earlier attempts included
//	{"type":"truncated","limit_bytes":…,"dropped_lines":…,"dropped_bytes":…}
//
// It never holds the API key or any HTTP header. A line longer than a quarter of the limit (at
// least 64 KiB), such as one carrying a 10 MB argument the model sent, is shrunk first: its
// strings longer than 4 KiB keep head and tail around a "bytes cut" marker, and
// "shrunk":{"bytes":…,"sha256":…} describes the line as it was; when that is still too long only
// type, time, turn, id, tool, exit_code and error remain. So no single event can use up the
// transcript and hide what came after it. When the next line would pass the limit, that line and
// all later ones are dropped and a last "truncated" line says how much was lost.

const (
	// markerReserve is kept free under the limit for the "truncated" line.
	markerReserve = 256
	// minLineLimit is the least a line may take before it is shrunk.
	minLineLimit = 64 << 10
	// shrinkString is how long a string of a shrunk line may stay.
	shrinkString = 4 << 10
)

// transcript writes the lines to w as the run goes, so that the caller can keep them out of
// memory (Request.Transcript). A write that fails drops that line and every later one: the
// caller's writer knows why.
type transcript struct {
	limit        int64
	w            io.Writer
	written      int64
	failed       bool
	droppedLines int
	droppedBytes int64
}

type truncatedLine struct {
	Type         string `json:"type"`
	Time         string `json:"time"`
	LimitBytes   int64  `json:"limit_bytes"`
	DroppedLines int    `json:"dropped_lines"`
	DroppedBytes int64  `json:"dropped_bytes"`
}

// add appends one event. v must marshal to a JSON object.
func (t *transcript) add(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		line, _ = json.Marshal(map[string]string{"type": "transcript_error", "time": now(), "error": err.Error()})
	}
	line = escapeInvisible(line)
	if lineLimit := max(t.limit/4, minLineLimit); int64(len(line)) > lineLimit {
		line = shrinkLine(line, lineLimit)
	}
	line = append(line, '\n')
	if t.droppedLines == 0 && t.written+int64(len(line)) <= t.limit-markerReserve && t.write(line) {
		return
	}
	t.droppedLines++
	t.droppedBytes += int64(len(line))
}

func (t *transcript) write(line []byte) bool {
	if t.failed {
		return false
	}
	n, err := t.w.Write(line)
	t.written += int64(n)
	t.failed = err != nil
	return err == nil
}

// end writes the truncation line when something was dropped.
func (t *transcript) end() {
	if t.droppedLines == 0 {
		return
	}
	marker, _ := json.Marshal(truncatedLine{
		Type:         "truncated",
		Time:         now(),
		LimitBytes:   t.limit,
		DroppedLines: t.droppedLines,
		DroppedBytes: t.droppedBytes,
	})
	t.write(append(marker, '\n'))
}

// escapeInvisible writes the control and format characters that JSON lets through as they are
// (C1 controls, bidirectional overrides, zero-width characters: json.Marshal escapes only
// those below U+0020) as \u escapes, so that a transcript shown in a terminal displays what the
// model sent instead of letting it reorder or hide text. Such runes can only stand inside JSON
// strings, where the escape means the same rune.
func escapeInvisible(line []byte) []byte {
	if !bytes.ContainsFunc(line, invisible) {
		return line
	}
	out := make([]byte, 0, len(line)+32)
	for len(line) > 0 {
		r, n := utf8.DecodeRune(line)
		if !invisible(r) {
			out = append(out, line[:n]...)
		} else {
			for _, u := range utf16.Encode([]rune{r}) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		}
		line = line[n:]
	}
	return out
}

func invisible(r rune) bool {
	return r >= 0x80 && (unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029')
}

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// Transcript lines.

type requestLine struct {
	Type     string            `json:"type"`
	Time     string            `json:"time"`
	Turn     int               `json:"turn"`
	Params   json.RawMessage   `json:"params,omitempty"`
	Messages []json.RawMessage `json:"messages"`
}

type responseLine struct {
	Type         string          `json:"type"`
	Time         string          `json:"time"`
	Turn         int             `json:"turn"`
	ID           string          `json:"id"`
	Model        string          `json:"model"`
	FinishReason string          `json:"finish_reason"`
	Usage        Usage           `json:"usage"`
	Message      json.RawMessage `json:"message,omitempty"`
	DurationMS   int64           `json:"duration_ms"`
}

type toolCallLine struct {
	Type       string        `json:"type"`
	Time       string        `json:"time"`
	Turn       int           `json:"turn"`
	ID         string        `json:"id"`
	Tool       string        `json:"tool"`
	Args       any           `json:"args"`
	Argv       []string      `json:"argv,omitempty"`
	Result     any           `json:"result"`
	ExitCode   int           `json:"exit_code"`
	TimedOut   bool          `json:"timed_out"`
	Truncated  bool          `json:"truncated"`
	DurationMS int64         `json:"duration_ms"`
	ApprovalMS *int64        `json:"approval_ms,omitempty"`
	ExecMS     *int64        `json:"exec_ms,omitempty"`
	Stdout     *streamDigest `json:"stdout,omitempty"`
	Stderr     *streamDigest `json:"stderr,omitempty"`
	Error      string        `json:"error,omitempty"`
}

// streamDigest identifies one output stream of a command as the sandbox captured it.
type streamDigest struct {
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
}

func digestOf(b []byte) streamDigest {
	sum := sha256.Sum256(b)
	return streamDigest{Bytes: len(b), SHA256: hex.EncodeToString(sum[:])}
}

// notRunLine counts the calls of one answer past the maxNotRunLines that skip answered.
type notRunLine struct {
	Type  string `json:"type"`
	Time  string `json:"time"`
	Turn  int    `json:"turn"`
	Calls int    `json:"calls"`
	Error string `json:"error"`
}

type finalLine struct {
	Type      string  `json:"type"`
	Time      string  `json:"time"`
	Outcome   Outcome `json:"outcome,omitempty"`
	Cap       string  `json:"cap,omitempty"`
	Message   string  `json:"message"`
	Turns     int     `json:"turns"`
	ToolCalls int     `json:"tool_calls"`
	Usage     Usage   `json:"usage"`
	Spent     Budget  `json:"spent"`
	Error     string  `json:"error,omitempty"`
}

// rawJSON keeps s as JSON when it is valid and every reader can take its numbers
// (checkNumbers), and as a JSON string otherwise, so a model's malformed arguments are still
// recorded exactly and never make a line unreadable.
func rawJSON(s string) any {
	if v, err := jsonschema.UnmarshalJSON(strings.NewReader(s)); err == nil && checkNumbers(v) == nil {
		return json.RawMessage(s)
	}
	return s // not JSON, or a number a reader could not take (checkNumbers): as text
}

func sinceMS(start time.Time) int64 { return time.Since(start).Milliseconds() }

// shrinkLine returns a version of an oversize line of at most limit bytes (see the top of this
// file).
func shrinkLine(line []byte, limit int64) []byte {
	sum := sha256.Sum256(line)
	info := map[string]any{"bytes": len(line), "sha256": hex.EncodeToString(sum[:])}
	var v map[string]any
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		v = map[string]any{}
	}
	v = shrinkValue(v).(map[string]any)
	v["shrunk"] = info
	// Marshalled anew, the line has lost add's escapes: escaped again, before it is measured,
	// as the escapes make it longer.
	if out, err := json.Marshal(v); err == nil {
		if out = escapeInvisible(out); int64(len(out)) <= limit {
			return out
		}
	}
	// Still too long: a huge array of small items, say. Keep what identifies the event.
	stub := map[string]any{"shrunk": info}
	for _, k := range []string{"type", "time", "turn", "id", "tool", "exit_code", "error"} {
		if x, ok := v[k]; ok {
			if _, isString := x.(string); isString || k == "turn" || k == "exit_code" {
				stub[k] = x
			}
		}
	}
	out, _ := json.Marshal(stub)
	return escapeInvisible(out)
}

// shrinkValue clips every string of a decoded JSON value to shrinkString bytes.
func shrinkValue(v any) any {
	switch v := v.(type) {
	case string:
		s, _ := clip([]byte(v), shrinkString)
		return s
	case map[string]any:
		for k, x := range v {
			v[k] = shrinkValue(x)
		}
	case []any:
		for i, x := range v {
			v[i] = shrinkValue(x)
		}
	}
	return v
}
