package provenance

import (
	"encoding/json"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// A manifest or envelope is read from the store, where whoever may write it puts what they
// like within its 16 MiB. Decoded as it comes, a list of empty objects becomes a slice of
// structs tens of times its size, and a tree of values (protojson's structpb, a map of any)
// costs about 70 times its size: a reader (get, verify, logs, the worker adopting a run) would
// take gigabytes. checkShape reads the document once, allocating nothing, and refuses it
// before anything is decoded when a list is longer than a run makes it (the rules below) or
// when it holds more than maxTreeValues values outside those lists: every other value (the
// profile, the sandbox, members a newer worker may add) is counted, and there are a few
// hundred in a run.

// maxTreeValues is the most values a document holds outside its capped lists (the profile's
// spec, the sandbox, the timings, unknown members); a run holds a few hundred.
const maxTreeValues = 1 << 16

// maxShapeDepth is the deepest a document nests: as deep as Build writes one (its
// canonicalJSON's maxDepth). A profile's tool schemas are the deepest part of a run's, which
// config holds to config.MaxProfileDepth; a reader takes whatever Build wrote all the same,
// and what it costs is counted.
const maxShapeDepth = maxDepth

// MaxCalls is the most tool calls, model calls and response ids a manifest names: a run's
// are bounded by its profile's max_tool_calls and max_turns (30 and 20 by default), which
// config holds to this bound, and decoded, each tool call and model call takes a hundred to
// two hundred bytes whatever its JSON, an empty object of three: a reader takes no more than
// this many of each.
const MaxCalls = config.MaxCalls

// MaxSkipped is the most files of the artifact folder a manifest names as left out (the
// worker names that many and counts the rest in skipped_more).
const MaxSkipped = 64

// maxLabels is the most labels a job holds: a job message is at most job.MaxMessageBytes,
// each label `"a":"",` of it at least.
const maxLabels = job.MaxMessageBytes / len(`"a":"",`)

// maxSignatures is the most signatures an envelope holds: a worker signs with one key, and a
// verifier tries each against each key of its ring.
const maxSignatures = 8

// shapeRule is what a document may hold at one place. A nil rule is a value counted against
// maxTreeValues, as is everything under it.
type shapeRule struct {
	name string // where, for messages: "predicate.tool_calls"
	// max is the most elements of an array or members of an object (a map) here; 0 for none
	// but the tree count (an array's elements are then counted) or, for an object decoded as
	// a struct, none: an unknown member is skipped by the decoder, and a container in it is
	// counted.
	max int
	// members are the rules of an object's known members by their names in lower case (the
	// decoder takes a name in any case); elem is the rule of an array's elements and of a
	// map's values.
	members map[string]*shapeRule
	elem    *shapeRule
	// strict refuses a member not in members (the statement itself, as protojson did).
	strict bool
}

// structRule is an object decoded as a struct: scalars cost what they are, containers are
// counted unless members names them.
func structRule(name string, members map[string]*shapeRule) *shapeRule {
	return &shapeRule{name: name, members: members}
}

func listRule(name string, max int, elem *shapeRule) *shapeRule {
	return &shapeRule{name: name, max: max, elem: elem}
}

func mapRule(name string, max int) *shapeRule {
	return &shapeRule{name: name, max: max, elem: &shapeRule{name: name}}
}

// statementShape is a manifest as Build writes it.
var statementShape = &shapeRule{name: "statement", strict: true, members: map[string]*shapeRule{
	"_type":         {name: "_type"},
	"predicatetype": {name: "predicateType"},
	"subject": listRule("subject", MaxArtifacts+2, structRule("subject", map[string]*shapeRule{
		"digest":      mapRule("subject.digest", 8),
		"annotations": structRule("subject.annotations", nil),
	})),
	"predicate": structRule("predicate", map[string]*shapeRule{
		"job":    structRule("predicate.job", map[string]*shapeRule{"labels": mapRule("predicate.job.labels", maxLabels)}),
		"inputs": listRule("predicate.inputs", MaxInputs, structRule("predicate.inputs", nil)),
		"model": structRule("predicate.model", map[string]*shapeRule{
			"response_ids": listRule("predicate.model.response_ids", MaxCalls, &shapeRule{name: "predicate.model.response_ids"}),
		}),
		"tool_calls": listRule("predicate.tool_calls", MaxCalls, structRule("predicate.tool_calls", map[string]*shapeRule{
			"approval": structRule("predicate.tool_calls.approval", nil),
		})),
		"usage": structRule("predicate.usage", map[string]*shapeRule{
			"model_calls": listRule("predicate.usage.model_calls", MaxCalls, structRule("predicate.usage.model_calls", nil)),
		}),
		"egress": structRule("predicate.egress", map[string]*shapeRule{
			"hosts": listRule("predicate.egress.hosts", MaxEgressHosts, structRule("predicate.egress.hosts", nil)),
		}),
		"collected": structRule("predicate.collected", map[string]*shapeRule{
			"skipped": listRule("predicate.collected.skipped", MaxSkipped, structRule("predicate.collected.skipped", nil)),
		}),
	}),
}}

// envelopeShape is a DSSE envelope.
var envelopeShape = structRule("envelope", map[string]*shapeRule{
	"signatures": listRule("signatures", maxSignatures, structRule("signatures", nil)),
})

// checkShape returns nil when data is JSON whose lists and values root allows; otherwise an
// error wrapping ErrInvalid that says which list or part is too large. It allocates nothing
// for a document it accepts.
func checkShape(data []byte, root *shapeRule) error {
	if !json.Valid(data) {
		var v struct{}
		err := json.Unmarshal(data, &v) // the decoder's words for what is wrong
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	s := shapeScan{data: data, tree: maxTreeValues}
	return s.value(root, root.name)
}

// shapeScan walks a valid JSON document.
type shapeScan struct {
	data  []byte
	i     int
	tree  int // values left outside the capped lists
	depth int
}

func (s *shapeScan) value(r *shapeRule, where string) error {
	s.space()
	if r == nil {
		if s.tree == 0 {
			return fmt.Errorf("%w: %s holds more than %d values outside the lists a run records; no worker writes that", ErrInvalid, where, maxTreeValues)
		}
		s.tree--
	}
	switch s.data[s.i] {
	case '{':
		return s.container(r, where, '}')
	case '[':
		return s.container(r, where, ']')
	case '"':
		s.str()
	default:
		for s.i < len(s.data) && !isEnd(s.data[s.i]) {
			s.i++
		}
	}
	return nil
}

// container walks an object (end '}') or an array (end ']') under rule r.
func (s *shapeScan) container(r *shapeRule, where string, end byte) error {
	if s.depth++; s.depth > maxShapeDepth {
		return fmt.Errorf("%w: %s nests more than %d deep; no worker writes that", ErrInvalid, where, maxShapeDepth)
	}
	defer func() { s.depth-- }()
	s.i++
	var met [16]*shapeRule // the known members met
	for n := 1; ; n++ {
		if s.space(); s.data[s.i] == end {
			s.i++
			return nil
		}
		if s.data[s.i] == ',' {
			s.i++
			s.space()
		}
		if r != nil && r.max > 0 && n > r.max {
			return fmt.Errorf("%w: %s holds more than %d entries; no worker writes that many", ErrInvalid, r.name, r.max)
		}
		child, childWhere := r.elemOf(where)
		if end == '}' {
			var err error
			if child, childWhere, err = s.member(r, where, &met); err != nil {
				return err
			}
		}
		s.space()
		if r != nil && s.data[s.i] != '{' && s.data[s.i] != '[' && child == nil {
			child = r // a scalar in a known place costs what it is
		}
		if err := s.value(child, childWhere); err != nil {
			return err
		}
	}
}

// member reads a member's name and its colon in an object under rule r, and returns the rule
// of its value and where that is.
func (s *shapeScan) member(r *shapeRule, where string, met *[16]*shapeRule) (*shapeRule, string, error) {
	key := s.str()
	s.space()
	s.i++ // ':'
	child, known := r.member(key)
	switch {
	case known && duplicate(met, child):
		return nil, "", fmt.Errorf("%w: %s names %q twice", ErrInvalid, where, key)
	case known:
		return child, child.name, nil
	case r != nil && r.strict:
		return nil, "", fmt.Errorf("%w: %s has a member %q, which an in-toto statement does not", ErrInvalid, where, key)
	case r != nil && r.max > 0:
		return r.elem, r.name, nil // a map's value
	}
	return nil, where, nil
}

// elemOf is the rule of an array's elements under r: its elem, or counted.
func (r *shapeRule) elemOf(where string) (*shapeRule, string) {
	if r == nil || r.max == 0 || r.elem == nil {
		return nil, where
	}
	return r.elem, r.elem.name
}

// member is the rule of the member named key (a JSON string's bytes, unescaped or not), as
// the decoder matches names: in any case. A name with an escape in it matches none, and what
// it holds is counted.
func (r *shapeRule) member(key []byte) (*shapeRule, bool) {
	if r == nil || r.members == nil || len(key) > 32 {
		return nil, false
	}
	var lower [32]byte
	for i, c := range key {
		if c == '\\' {
			return nil, false
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	child, ok := r.members[string(lower[:len(key)])]
	return child, ok
}

// duplicate records child as met and reports whether it was met before: a second member of
// one name is taken by one decoder and not by another (protojson refuses it, encoding/json
// keeps the last), so a signed manifest could be read two ways.
func duplicate(met *[16]*shapeRule, child *shapeRule) bool {
	for i, m := range met {
		switch m {
		case child:
			return true
		case nil:
			met[i] = child
			return false
		}
	}
	return false
}

// str skips a JSON string at s.i and returns its bytes between the quotes, escapes as written.
func (s *shapeScan) str() []byte {
	start := s.i + 1
	for s.i = start; s.data[s.i] != '"'; s.i++ {
		if s.data[s.i] == '\\' {
			s.i++
		}
	}
	s.i++
	return s.data[start : s.i-1]
}

func (s *shapeScan) space() {
	for s.i < len(s.data) && (s.data[s.i] == ' ' || s.data[s.i] == '\t' || s.data[s.i] == '\n' || s.data[s.i] == '\r') {
		s.i++
	}
}

func isEnd(c byte) bool {
	return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}
