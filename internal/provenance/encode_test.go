package provenance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// longWay is what appendJCS stands in for: encoding/json's text, canonicalised.
func longWay(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return canonicalJSON(data)
}

// sameAsLongWay fails t unless appendJCS writes v as json.Marshal and canonicalJSON do, or
// both refuse it.
func sameAsLongWay(t *testing.T, name string, v any) {
	t.Helper()
	want, wantErr := longWay(v)
	got, err := appendJCS(nil, reflect.ValueOf(v), 0)
	switch {
	case (err != nil) != (wantErr != nil):
		t.Errorf("%s: appendJCS error %v, the long way's %v", name, err, wantErr)
	case !bytes.Equal(got, want):
		t.Errorf("%s: appendJCS wrote\n%s\nthe long way\n%s", name, got, want)
	}
}

type withOddFields struct {
	Plain     string            `json:"plain"`
	Default   int               // no tag: the field's name
	Skipped   string            `json:"-"`
	hidden    string            //nolint:unused // unexported: never written
	Empty     []string          `json:"empty,omitempty"`
	Zero      time.Time         `json:"zero,omitzero"`
	ZoneZero  time.Time         `json:"zone_zero,omitzero"` // IsZero, though not the zero value
	NilMap    map[string]int    `json:"nil_map"`
	Bytes     []byte            `json:"bytes"`
	Any       any               `json:"any"`
	Float     float64           `json:"float"`
	Big       uint64            `json:"big"`
	Dur       job.Duration      `json:"dur"`
	PtrDur    *job.Duration     `json:"ptr_dur,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Nested    *withOddFields    `json:"nested,omitempty"`
	EmptyBool bool              `json:"empty_bool,omitempty"`
}

// Each of these is written the long way.
type (
	embeds struct {
		withOddFields
		Own string `json:"own"`
	}
	// A plan for one struct type goes the long way, and the others keep theirs.
	quoted struct {
		N int64 `json:"n,string"`
	}
	dashed struct {
		S string `json:"da-shed,omitempty"`
	}
	twice struct {
		A string `json:"B"`
		B string // json's name, like A's
	}
	zeroerByPointer struct {
		Z *time.Time `json:"z,omitzero"`
	}
)

// Types of scalar, slice and map kinds with an encoding of their own, which neither a
// struct's plan (planField.scalar) nor noMethods may take for plain ones: encoding/json writes
// each by its method, the pointer's only where the field is addressable.
type (
	textScalar   string
	ptrScalar    int
	jsonBool     bool
	joined       []string
	countedMap   map[string]int
	plainKind    string // no method: a scalar
	ownEncodings struct {
		T     textScalar `json:"t"`
		P     ptrScalar  `json:"p"`
		B     jsonBool   `json:"b"`
		L     joined     `json:"l"`
		M     countedMap `json:"m"`
		Plain plainKind  `json:"plain"`
	}
)

func (s textScalar) MarshalText() ([]byte, error) { return []byte("text:" + string(s)), nil }
func (s *ptrScalar) MarshalText() ([]byte, error) { return fmt.Appendf(nil, "ptr:%d", int(*s)), nil }
func (b jsonBool) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(strconv.FormatBool(bool(b)))), nil
}
func (l joined) MarshalText() ([]byte, error)     { return []byte(strings.Join(l, ",")), nil }
func (m countedMap) MarshalJSON() ([]byte, error) { return []byte(strconv.Itoa(len(m))), nil }

// leafList ends in a struct with a scalar field, whose depth is the field's, not its struct's.
type leafList struct {
	Next *leafList `json:"next,omitempty"`
	S    string    `json:"s"`
}

func deepLeafList(n int) *leafList {
	l := &leafList{S: "leaf"}
	for range n {
		l = &leafList{Next: l}
	}
	return l
}

// loop is a pointer to its own type, which json.Marshal refuses when it points to itself.
type loop *loop

// numbered holds json.Number, a string that encoding/json writes as the number it spells.
type numbered struct {
	N     json.Number  `json:"n"`
	Empty json.Number  `json:"empty,omitempty"`
	Ptr   *json.Number `json:"ptr"`
}

// TestEncoderMatchesMarshal: appendJCS writes what json.Marshal and canonicalJSON write, on a
// manifest and on what the manifest's types do not hold but might one day.
func TestEncoderMatchesMarshal(t *testing.T) {
	paris := time.FixedZone("CET", 3600)
	odd := withOddFields{
		Plain: "<b>&</b> \u2028 \u2029 caf\u00e9 \U0001F600 \x7f \x00 \t \"q\" \\", Default: -0,
		NilMap: nil, Bytes: []byte("bytes"), Any: map[string]any{"n": 1e21, "m": 1e-7, "k": []any{int64(1<<62 + 1), "s", nil}},
		Float: 0.1, Big: math.MaxUint64, Dur: job.Duration(1500 * time.Millisecond), PtrDur: ptrTo(job.Duration(time.Second)),
		Labels:   map[string]string{"\uff61": "a", "\U0001F600": "b", "a\xffb": "invalid", "": "empty", "Z": "upper"},
		Nested:   &withOddFields{Plain: "bad \xff\xfe utf-8 \xe2\x82", Zero: time.Date(2026, 1, 2, 3, 4, 5, 6, paris)},
		ZoneZero: time.Time{}.In(paris),
	}
	tests := map[string]any{
		"odd fields":          odd,
		"odd fields' pointer": &odd,
		"embedded":            embeds{withOddFields: odd, Own: "own"},
		"string option":       quoted{1 << 60},
		"dashed name":         dashed{"x"},
		"a name twice":        twice{"a", "b"},
		"IsZero by pointer":   zeroerByPointer{&time.Time{}},
		"config profile":      config.Profile{Model: config.ModelParams{Name: "m", Temperature: ptrTo(0.0), Seed: ptrTo(int64(1<<62 + 1))}, Tools: []config.Tool{{Name: "t", Parameters: map[string]any{"type": "object", "\u00e9": 1.5}}}},
		"manifest":            Manifest{Job: Job{ID: "x", Labels: map[string]string{"b": "2", "a": "1"}}, Egress: &Egress{Hosts: []EgressHost{{Host: "h"}}}, Usage: &RunUsage{PhasesMS: map[string]int64{"run": 3, "admit": 1}}},
		"empty manifest":      Manifest{},
		"nil slice":           []string(nil),
		"NaN":                 math.NaN(),
		"keys that collide":   map[string]int{"a\xff": 1, "a\xfe": 2},
		"deep":                deepValue(maxDepth + 5),
		"deep structs":        deepList(maxDepth + 5),
		"structs not so deep": deepList(maxDepth / 2),
		"int keys":            map[int]string{2: "b", 10: "a"},
		"array":               [3]int{3, 2, 1},
		"times": []time.Time{time.Now(), {}, time.Date(2026, 12, 7, 1, 2, 3, 400, paris), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
			time.Date(0, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 23*3600+59*60))},
		"a time past 9999":                  time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		"a time before year 0":              time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		"a zone 24 hours away":              time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("x", 24*3600)),
		"a zone -24 hours away":             time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("x", -24*3600)),
		"durations":                         []job.Duration{0, -1, 1, job.Duration(90 * time.Second), job.Duration(math.MaxInt64), job.Duration(math.MinInt64)},
		"a pointer to a duration":           ptrTo(job.Duration(time.Millisecond)),
		"string array":                      [2]string{"\xff", "z"},
		"json.Number":                       json.Number("1e2"),
		"json.Numbers":                      []json.Number{"12.50", "-0", "", "1"},
		"json.Number fields":                numbered{N: "0.10", Ptr: ptrTo(json.Number("123456789012345678901"))},
		"a json.Number not one":             json.Number("x"),
		"own encodings":                     ownEncodings{T: "a<", P: 3, B: true, L: joined{"a", "b"}, M: countedMap{"a": 1}, Plain: "x\u2028"},
		"own encodings' pointer":            &ownEncodings{T: "a<", P: 3, B: true, L: joined{"a", "b"}, M: countedMap{"a": 1}, Plain: "x\u2028"},
		"a scalar field one level too deep": deepLeafList(maxDepth),
		"a scalar field at the deepest":     deepLeafList(maxDepth - 1),
	}
	var self loop
	self = &self
	tests["a pointer to itself"] = self
	tests["a pointer to a pointer"] = ptrTo(ptrTo(withOddFields{Plain: "p"}))
	for name, v := range tests {
		sameAsLongWay(t, name, v)
	}
}

func deepValue(n int) any {
	var v any = "leaf"
	for range n {
		v = []any{v}
	}
	return v
}

type list struct {
	Next *list `json:"next,omitempty"`
}

func deepList(n int) *list {
	l := &list{}
	for range n {
		l = &list{Next: l}
	}
	return l
}

func ptrTo[T any](v T) *T { return &v }

// FuzzEncoderMatchesMarshal: any strings and numbers in a manifest are written as the long
// way writes them.
func FuzzEncoderMatchesMarshal(f *testing.F) {
	f.Add("task", "label", "value", int64(1), 0.5, "\u2028<&>")
	f.Add("\xff\xfe", "\U0001F600", "\uff61", int64(-1<<63), 1e21, "\x00\x1f\"\\")
	f.Fuzz(func(t *testing.T, task, key, value string, n int64, x float64, other string) {
		m := Manifest{
			Job:       Job{ID: key, Task: task, Labels: map[string]string{key: value, other: task}},
			Inputs:    []Input{{Name: other, SHA256: value, Size: n}},
			Model:     Model{Name: other, Params: ModelParams{Temperature: &x, Seed: &n}, ResponseIDs: []string{task, ""}},
			ToolCalls: []ToolCall{{ID: key, Tool: value, ExitCode: int(n), Error: other}},
			Outcome:   Outcome{State: job.State(value), Error: task},
			Attempt:   int(n),
			Usage:     &RunUsage{PhasesMS: map[string]int64{key: n, value: -n}},
		}
		sameAsLongWay(t, "manifest", m)
	})
}

// TestEncoderTakesNoShortcutForOwnEncodings: a type with a method of its own is written by it.
func TestEncoderTakesNoShortcutForOwnEncodings(t *testing.T) {
	got, err := appendJCS(nil, reflect.ValueOf(struct {
		D job.Duration `json:"d"`
		T time.Time    `json:"t"`
	}{job.Duration(time.Minute), time.Unix(0, 0).UTC()}), 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"d":"1m0s","t":"1970-01-01T00:00:00Z"}`; string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
