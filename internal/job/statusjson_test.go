package job_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
)

// statusesToEncode are statuses as the runner and submit write them, and the strings and
// times json.Marshal escapes or refuses.
func statusesToEncode() map[string]job.Status {
	at := time.Date(2026, 12, 7, 23, 4, 5, 123456789, time.UTC)
	return map[string]job.Status{
		"zero":               {},
		"claim":              {ID: "j1", State: job.StateRunning, Profile: "p", Attempt: 1, Worker: "w-1", Progress: "starting sandbox", MaxCalls: 50, StartedAt: at, UpdatedAt: at},
		"labels":             {ID: "j1", State: job.StateQueued, Labels: map[string]string{"team": "a", "b": "x<y>&z", "": "empty key"}},
		"empty maps omitted": {ID: "j1", Labels: map[string]string{}, Asked: map[string]job.Asked{}},
		"every field": {
			ID: "j1", State: job.StateSucceeded, Profile: "p", Labels: map[string]string{"k": "v"}, Attempt: 3, Worker: "w",
			Progress: "uploading", ToolCalls: 4, MaxCalls: 5, Cap: "turns", Error: "line\nbreak \"quoted\" \\ tab\t", SpentTurns: 6,
			SpentToolCalls: 7, SpentTokens: 1 << 40, CancelRequested: true, HandedBack: 2, Ending: job.StateDead,
			Asked:  map[string]job.Asked{"c2": {Revision: 9, ExpiresAt: at, Expired: true}, "c1": {Revision: 1}},
			Report: "runs/j1/a/report.json", Manifest: "runs/j1/manifest.json", Unsigned: true,
			SandboxClaimedAt: at, SandboxWarm: true, QueuedAt: at.Add(-time.Second), StartedAt: at, FinishedAt: at, UpdatedAt: at,
		},
		"negative counts":   {ID: "j1", Attempt: -1, SpentTokens: -5},
		"not ASCII":         {ID: "j1", Error: "é \u2028 \u2029 \x7f \x00 \xff bad utf-8"},
		"edges of ASCII":    {ID: "j1", Error: "\x1f", Progress: " ~\x7f"},
		"zone":              {ID: "j1", StartedAt: at.In(time.FixedZone("", -(5*3600 + 30*60 + 7)))},
		"whole seconds":     {ID: "j1", StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		"year 10000":        {ID: "j1", UpdatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"year -1":           {ID: "j1", QueuedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
		"asked year 10000":  {ID: "j1", Asked: map[string]job.Asked{"c": {ExpiresAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}},
		"zone of 24 hours":  {ID: "j1", StartedAt: at.In(time.FixedZone("", 24*3600))},
		"zone of -24 hours": {ID: "j1", FinishedAt: at.In(time.FixedZone("", -24*3600))},
		"zone of -23:59:59": {ID: "j1", FinishedAt: at.In(time.FixedZone("", -(24*3600 - 1)))},
	}
}

// TestStatusAppendJSONMatchesMarshal: a status's own encoder writes what json.Marshal writes,
// byte for byte, and refuses what it refuses; every field of Status and of Asked is set in
// "every field", so a new field fails here until the encoder writes it, an omitempty one too.
func TestStatusAppendJSONMatchesMarshal(t *testing.T) {
	t.Parallel()
	for name, st := range statusesToEncode() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			assertEncodesAsMarshal(t, st)
		})
	}
	every := reflect.ValueOf(statusesToEncode()["every field"])
	for i := range every.NumField() {
		if every.Field(i).IsZero() {
			t.Errorf("the status of every field leaves %s unset", every.Type().Field(i).Name)
		}
	}
	asked := reflect.ValueOf(statusesToEncode()["every field"].Asked["c2"])
	for i := range asked.NumField() {
		if asked.Field(i).IsZero() {
			t.Errorf("the status of every field leaves Asked.%s unset", asked.Type().Field(i).Name)
		}
	}
}

func assertEncodesAsMarshal(t *testing.T, st job.Status) {
	t.Helper()
	want, wantErr := json.Marshal(st)
	got, err := st.AppendJSON([]byte("prefix"))
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("AppendJSON error %v, json.Marshal's %v", err, wantErr)
	}
	if err != nil {
		return
	}
	got, ok := bytes.CutPrefix(got, []byte("prefix"))
	if !ok {
		t.Fatalf("AppendJSON did not append: %s", got)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendJSON wrote\n%s\njson.Marshal\n%s", got, want)
	}
}

// FuzzStatusAppendJSONMatchesMarshal holds the encoder to json.Marshal for any strings and
// times.
func FuzzStatusAppendJSONMatchesMarshal(f *testing.F) {
	f.Add("j1", "oops <b>", "k", "v", int64(1765148645), int64(123), 0)
	f.Add("\xff", "\u2028", "", "\x00", int64(-62135596800), int64(0), -3600)
	f.Add("j", "e", "k", "v", int64(253402300800), int64(1), 86400)
	f.Fuzz(func(t *testing.T, id, errText, k, v string, sec, nsec int64, off int) {
		at := time.Unix(sec, nsec).In(time.FixedZone("", off%(48*3600)))
		assertEncodesAsMarshal(t, job.Status{
			ID: id, State: job.State(v), Error: errText, Progress: strings.Repeat(k, 2), Labels: map[string]string{k: v, id: errText},
			Asked: map[string]job.Asked{k: {Revision: uint64(sec), ExpiresAt: at}}, StartedAt: at, UpdatedAt: at.UTC(),
		})
	})
}

// BenchmarkStatusEncode is what a claim's status write spends encoding the status.
func BenchmarkStatusEncode(b *testing.B) {
	st := statusesToEncode()["claim"]
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(st); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := st.AppendJSON(make([]byte, 0, 512)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
