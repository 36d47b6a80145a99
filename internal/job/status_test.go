package job_test

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
)

// TestClearAttempt: a new attempt's status keeps what all attempts share and nothing the
// attempt before wrote of itself (a retried job showed attempt 1's warm sandbox while attempt 2
// waited for its own). Every field of Status is in one of the lists below, so a new field
// fails here until it is placed.
func TestClearAttempt(t *testing.T) {
	t.Parallel()
	perAttempt := []string{"Progress", "Error", "Cap", "SandboxClaimedAt", "SandboxWarm", "FinishedAt", "Ending"}
	writtenByAttempt := []string{"State", "Attempt", "Worker", "StartedAt", "MaxCalls"}
	shared := []string{"ID", "Profile", "Labels", "ToolCalls", "SpentTurns", "SpentToolCalls", "SpentTokens",
		"CancelRequested", "HandedBack", "Asked", "Report", "Manifest", "Unsigned", "QueuedAt", "UpdatedAt"}

	var s job.Status
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		setNonZero(t, v.Type().Field(i).Name, v.Field(i))
	}
	before := s
	s.ClearAttempt()
	after := reflect.ValueOf(s)
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		got, was := after.Field(i).Interface(), reflect.ValueOf(before).Field(i).Interface()
		switch {
		case slices.Contains(perAttempt, name):
			if !after.Field(i).IsZero() {
				t.Errorf("ClearAttempt kept %s = %v, the attempt before's", name, got)
			}
		case slices.Contains(shared, name), slices.Contains(writtenByAttempt, name):
			if !reflect.DeepEqual(got, was) {
				t.Errorf("ClearAttempt changed %s from %v to %v", name, was, got)
			}
		default:
			t.Errorf("Status.%s is in no list: is it the attempt's (ClearAttempt clears it), written by each attempt, or shared by all?", name)
		}
	}
}

func setNonZero(t *testing.T, name string, f reflect.Value) {
	t.Helper()
	switch f.Kind() {
	case reflect.String:
		f.SetString("x")
	case reflect.Int, reflect.Int64:
		f.SetInt(1)
	case reflect.Bool:
		f.SetBool(true)
	case reflect.Map:
		f.Set(reflect.MakeMap(f.Type()))
		f.SetMapIndex(reflect.ValueOf("k"), reflect.Zero(f.Type().Elem()))
	case reflect.Struct:
		if f.Type() != reflect.TypeFor[time.Time]() {
			t.Fatalf("Status.%s: a %s; give setNonZero a value for it", name, f.Type())
		}
		f.Set(reflect.ValueOf(time.Unix(1, 0)))
	default:
		t.Fatalf("Status.%s: a %s; give setNonZero a value for it", name, f.Type())
	}
}

// TestRecordAskedForgets: Status.Asked holds at most job.MaxAsked requests; a new one past it
// forgets first a request the worker stopped waiting for, then the oldest asked, and never the
// one just asked, nor anything while there is room.
func TestRecordAskedForgets(t *testing.T) {
	t.Parallel()
	full := func(expired ...int) job.Status {
		var s job.Status
		for i := range job.MaxAsked {
			s.RecordAsked(fmt.Sprint("call_", i), job.Asked{Revision: uint64(10 + i), Expired: slices.Contains(expired, i)})
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		s      job.Status
		call   string
		forgot string // "": none
	}{
		{name: "room left", s: job.Status{Asked: map[string]job.Asked{"call_0": {Revision: 1}}}, call: "call_new"},
		{name: "full: the oldest", s: full(), call: "call_new", forgot: "call_0"},
		{name: "full: an expired one before the oldest", s: full(7), call: "call_new", forgot: "call_7"},
		{name: "full, asked again: its own entry", s: full(), call: "call_3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := maps.Clone(tc.s.Asked)
			tc.s.RecordAsked(tc.call, job.Asked{Revision: 1 << 20})
			if len(tc.s.Asked) > job.MaxAsked {
				t.Errorf("%d requests recorded, want at most %d", len(tc.s.Asked), job.MaxAsked)
			}
			if got := tc.s.Asked[tc.call]; got.Revision != 1<<20 {
				t.Errorf("the request just asked: %+v", got)
			}
			for id := range before {
				if _, kept := tc.s.Asked[id]; kept == (id == tc.forgot) {
					t.Errorf("%s kept %v, want forgotten only %q", id, kept, tc.forgot)
				}
			}
		})
	}
}

// TestStatusGrowsWithinBounds: the status is a NATS message, refused past the server's
// max_payload, so no field of it may grow with a job's activity without a bound. Every map and
// slice of Status is placed here with what bounds it, so a new one fails until it is bounded.
func TestStatusGrowsWithinBounds(t *testing.T) {
	t.Parallel()
	bounded := map[string]string{
		"Labels": "the job's, copied once when it is queued: within job.MaxMessageBytes",
		"Asked":  "one per approval asked: at most job.MaxAsked (RecordAsked)",
	}
	for f := range reflect.TypeFor[job.Status]().Fields() {
		switch f.Type.Kind() {
		case reflect.Map, reflect.Slice, reflect.Array:
			if bounded[f.Name] == "" {
				t.Errorf("Status.%s (%s) grows with no bound placed here", f.Name, f.Type)
			}
		}
	}
}

// TestStatusCloneSharesNothing: a clone shares no map or slice of Status with the original,
// whichever a new field adds: the queue's handle keeps the status it wrote last and gives each
// write a clone (a write under way while another edits the same map was a data race).
func TestStatusCloneSharesNothing(t *testing.T) {
	t.Parallel()
	var s job.Status
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Map:
			f.Set(reflect.MakeMapWithSize(f.Type(), 1))
			f.SetMapIndex(reflect.New(f.Type().Key()).Elem(), reflect.New(f.Type().Elem()).Elem())
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		}
	}
	c := reflect.ValueOf(s.Clone())
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Map, reflect.Slice:
			if f.UnsafePointer() == c.Field(i).UnsafePointer() {
				t.Errorf("Status.%s is shared by the clone", v.Type().Field(i).Name)
			}
		}
	}
}
