package job

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"
)

// AppendJSON appends the status as json.Marshal writes it, byte for byte, without its
// reflection: every job's claim and end write one (queue's update), and encoding/json's walk
// of the struct was the larger part of a status write's CPU. A time json.Marshal refuses (a
// year outside 0-9999) is refused the same way, by json.Marshal itself.
func (s *Status) AppendJSON(b []byte) ([]byte, error) {
	for _, t := range [...]time.Time{s.SandboxClaimedAt, s.QueuedAt, s.StartedAt, s.FinishedAt, s.UpdatedAt} {
		if !jsonTime(t) {
			return json.Marshal(s)
		}
	}
	for _, a := range s.Asked {
		if !jsonTime(a.ExpiresAt) {
			return json.Marshal(s)
		}
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, s.ID)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, string(s.State))
	b = appendStringField(b, "profile", s.Profile)
	if len(s.Labels) > 0 {
		b = append(b, `,"labels":{`...)
		for i, k := range slices.Sorted(maps.Keys(s.Labels)) {
			b = appendKey(b, i, k)
			b = appendJSONString(b, s.Labels[k])
		}
		b = append(b, '}')
	}
	b = appendIntField(b, "attempt", int64(s.Attempt))
	b = appendStringField(b, "worker", s.Worker)
	b = appendStringField(b, "progress", s.Progress)
	b = appendIntField(b, "tool_calls", int64(s.ToolCalls))
	b = appendIntField(b, "max_tool_calls", int64(s.MaxCalls))
	b = appendStringField(b, "cap", s.Cap)
	b = appendStringField(b, "error", s.Error)
	b = appendIntField(b, "spent_turns", int64(s.SpentTurns))
	b = appendIntField(b, "spent_tool_calls", int64(s.SpentToolCalls))
	b = appendIntField(b, "spent_tokens", s.SpentTokens)
	b = appendTrueField(b, "cancel_requested", s.CancelRequested)
	b = appendIntField(b, "handed_back", int64(s.HandedBack))
	b = appendStringField(b, "ending", string(s.Ending))
	if len(s.Asked) > 0 {
		b = append(b, `,"asked":{`...)
		for i, k := range slices.Sorted(maps.Keys(s.Asked)) {
			b = appendKey(b, i, k)
			b = s.Asked[k].appendJSON(b)
		}
		b = append(b, '}')
	}
	b = appendStringField(b, "report", s.Report)
	b = appendStringField(b, "manifest", s.Manifest)
	b = appendTrueField(b, "unsigned", s.Unsigned)
	b = appendTimeField(b, "sandbox_claimed_at", s.SandboxClaimedAt)
	b = appendTrueField(b, "sandbox_warm", s.SandboxWarm)
	b = appendTimeField(b, "queued_at", s.QueuedAt)
	b = appendTimeField(b, "started_at", s.StartedAt)
	b = appendTimeField(b, "finished_at", s.FinishedAt)
	b = appendTimeField(b, "updated_at", s.UpdatedAt)
	return append(b, '}'), nil
}

func (a Asked) appendJSON(b []byte) []byte {
	b = append(b, `{"revision":`...)
	b = strconv.AppendUint(b, a.Revision, 10)
	b = append(b, `,"expires_at":`...)
	b = appendJSONTime(b, a.ExpiresAt)
	b = appendTrueField(b, "expired", a.Expired)
	return append(b, '}')
}

// jsonTime reports whether t is a time json.Marshal writes (time.Time.MarshalJSON).
func jsonTime(t time.Time) bool {
	y := t.Year()
	if y < 0 || y > 9999 {
		return false
	}
	_, off := t.Zone()
	return off > -24*60*60 && off < 24*60*60
}

// appendKey starts the i-th member of an object with key k.
func appendKey(b []byte, i int, k string) []byte {
	if i > 0 {
		b = append(b, ',')
	}
	b = appendJSONString(b, k)
	return append(b, ':')
}

// The appendXField functions write a member of the status after its first (the id), omitted
// as omitempty or omitzero omits it.

func appendStringField(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	b = appendName(b, name)
	return appendJSONString(b, v)
}

func appendIntField(b []byte, name string, v int64) []byte {
	if v == 0 {
		return b
	}
	b = appendName(b, name)
	return strconv.AppendInt(b, v, 10)
}

func appendTrueField(b []byte, name string, v bool) []byte {
	if !v {
		return b
	}
	b = appendName(b, name)
	return append(b, "true"...)
}

func appendTimeField(b []byte, name string, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	b = appendName(b, name)
	return appendJSONTime(b, t)
}

func appendName(b []byte, name string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

// appendJSONTime writes t as time.Time.MarshalJSON does, for a t that jsonTime passed.
func appendJSONTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendJSONString writes s as json.Marshal does: printable ASCII other than the quote, the
// backslash and the characters it escapes for HTML (<, >, &) as it is, anything else through
// json.Marshal itself, which is rare in a status (an error's text may have some).
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
