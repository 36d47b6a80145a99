package config

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/boxcar-run/boxcar/internal/textcut"
)

// decoder fills a Go value from a YAML node tree, as YAML 1.2 reads it: a key or a value like
// n, yes or off is the string it looks like, true and false are the only booleans. Every
// problem becomes a FieldError with the line and column of the node and its key path, so one
// pass reports them all. Field names come from the json tags, the names the docs use.
type decoder struct {
	src  *Source
	errs []error
}

// Source is where each key of a config file is, so that a problem found after decoding (by
// Validate, or by the agent's checks of the tools) can name its line and column.
type Source struct {
	file string
	at   map[string]*yaml.Node // key path → the node of its value ("" is the document)
}

// decodeYAML reads data into v (a pointer) and returns where each key is. A YAML syntax error
// is one FieldError with the line the parser names.
func decodeYAML(file string, data []byte, v any) (*Source, error) {
	src := &Source{file: file, at: map[string]*yaml.Node{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return src, src.syntaxError(err)
	}
	d := &decoder{src: src}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		d.errs = append(d.errs, &FieldError{File: file, Line: max(extra.Line, 1), Column: extra.Column,
			Msg: "a second YAML document (after ---); a config file holds one"})
	}
	root := &doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		root = doc.Content[0]
	}
	if root.Kind == 0 { // an empty file: nothing set
		root = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: 1, Column: 1}
	}
	d.decode(root, reflect.ValueOf(v).Elem(), "")
	slices.SortStableFunc(d.errs, func(a, b error) int { return cmp.Compare(line(a), line(b)) })
	return src, errors.Join(d.errs...)
}

var syntaxLine = regexp.MustCompile(`^yaml: line (\d+): `)

// parserProblems are the problems of yaml's parser (parserc.go), as opposed to its scanner: it
// gives their line counted from 0 (the start of the enclosing block or flow collection), where
// the scanner's count from 1.
var parserProblems = map[string]bool{
	"did not find expected ',' or ']'": true, "did not find expected ',' or '}'": true,
	"did not find expected '-' indicator": true, "did not find expected <document start>": true,
	"did not find expected key": true, "did not find expected node content": true,
	"found incompatible YAML document": true, "found duplicate %YAML directive": true,
	"found duplicate %TAG directive": true,
}

func (s *Source) syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 1
	if m := syntaxLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = err.Error()[len(m[0]):]
		if parserProblems[msg] {
			line++
		}
	}
	return &FieldError{File: s.file, Line: line, Msg: "YAML syntax: " + msg}
}

// Place gives every FieldError in err that has no place yet the line and column of its key
// path in the file, or of the nearest enclosing key that is there (a required key that is
// missing is placed at its parent). Other errors pass as they are.
func (s *Source) Place(err error) error {
	if s == nil || err == nil {
		return err
	}
	// The error itself, not its chain: Place rebuilds the tree it walks, and a FieldError
	// wrapped in another message would lose that message if it were replaced by its place.
	switch e := err.(type) { //nolint:errorlint // see above
	case *FieldError:
		if e.Line > 0 {
			return e
		}
		placed := *e
		placed.File = s.file
		n := s.node(e.Path)
		placed.Line, placed.Column = max(n.Line, 1), max(n.Column, 1)
		return &placed
	case interface{ Unwrap() []error }:
		var errs []error
		for _, c := range e.Unwrap() {
			errs = append(errs, s.Place(c))
		}
		// In the order of the file, as a reader fixes them.
		slices.SortStableFunc(errs, func(a, b error) int { return cmp.Compare(line(a), line(b)) })
		return errors.Join(errs...)
	}
	return err
}

// line is where err is in the file: its line, or after every line when it is not placed.
func line(err error) int {
	var fe *FieldError
	if errors.As(err, &fe) && fe.Line > 0 {
		return fe.Line
	}
	return math.MaxInt
}

// node is the node of path, or of its nearest enclosing path in the file.
func (s *Source) node(path string) *yaml.Node {
	for {
		if n, ok := s.at[path]; ok {
			return n
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			if n, ok := s.at[""]; ok {
				return n
			}
			return &yaml.Node{Line: 1, Column: 1}
		}
		path = path[:i]
	}
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.errs = append(d.errs, &FieldError{File: d.src.file, Line: n.Line, Column: n.Column, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// unmarshalers are the types that read themselves from JSON, with what they expect in words.
var unmarshalers = map[reflect.Type]string{
	reflect.TypeFor[Duration](): "a duration such as 90s, 15m or 1h30m",
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.AliasNode {
		d.decode(n.Alias, v, path)
		return
	}
	d.src.at[path] = n
	if n.ShortTag() == "!!null" {
		return // as JSON's null: the field keeps its zero value, so its default
	}
	if want, ok := unmarshalers[v.Type()]; ok {
		d.unmarshaler(n, v, path, want)
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		d.decode(n, v.Elem(), path)
	case reflect.Struct:
		d.structure(n, v, path)
	case reflect.Map:
		d.mapping(n, v, path)
	case reflect.Slice:
		d.sequence(n, v, path)
	case reflect.Interface:
		d.anything(n, v, path)
	default:
		d.scalar(n, v, path)
	}
}

func (d *decoder) unmarshaler(n *yaml.Node, v reflect.Value, path, want string) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		d.fail(n, path, "expected %s, got %s", want, describe(n))
		return
	}
	data, _ := json.Marshal(n.Value)
	if err := v.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(data); err != nil {
		d.fail(n, path, "%q is not %s", withoutCredentials(n.Value), want)
	}
}

// structure fills a struct from a mapping, key by key: an unknown key is an error that names
// the key it most likely meant.
func (d *decoder) structure(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping of keys (%s), got %s", strings.Join(fieldNames(v.Type()), ", "), describe(n))
		return
	}
	fields := fieldIndex(v.Type())
	d.pairs(n, path, func(key, val *yaml.Node, p string) {
		i, ok := fields[key.Value]
		if !ok {
			d.fail(key, p, "unknown key%s", suggest(key.Value, fieldNames(v.Type())))
			return
		}
		d.decode(val, v.Field(i), p)
	})
}

func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping, got %s", describe(n))
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	d.pairs(n, path, func(key, val *yaml.Node, p string) {
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(val, elem, p)
		v.SetMapIndex(reflect.ValueOf(key.Value).Convert(v.Type().Key()), elem)
	})
}

// pairs calls each for every key and value of a mapping, with the key's path; a key that is
// not a plain name, or is given twice, is an error.
func (d *decoder) pairs(n *yaml.Node, path string, each func(key, val *yaml.Node, path string)) {
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		p := join(path, key.Value)
		switch {
		case key.Kind != yaml.ScalarNode:
			d.fail(key, path, "a key must be a name, got %s", describe(key))
			continue
		case key.Value == "<<" && key.ShortTag() == "!!merge":
			d.fail(key, path, "merge keys (<<) are not supported; write the keys out")
			continue
		case seen[key.Value] != nil:
			d.fail(key, p, "given twice (first on line %d)", seen[key.Value].Line)
			continue
		}
		seen[key.Value] = key
		each(key, val, p)
	}
}

func (d *decoder) sequence(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "expected a list, got %s", describe(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, el := range n.Content {
		d.decode(el, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
	}
	v.Set(s)
}

// anything fills an interface (a tool's parameters schema) with what JSON would hold: maps
// with string keys, lists, strings, float64 numbers and booleans, as YAML 1.2 reads them.
func (d *decoder) anything(n *yaml.Node, v reflect.Value, path string) {
	d.record(n, path)
	var out any
	if err := n.Decode(&out); err != nil {
		d.fail(n, path, "%v", err)
		return
	}
	data, err := json.Marshal(jsonable(out))
	if err == nil {
		err = json.Unmarshal(data, &out)
	}
	if err != nil {
		d.fail(n, path, "cannot be written as JSON: %v", err)
		return
	}
	if out != nil {
		v.Set(reflect.ValueOf(out))
	}
}

// record notes where each key under n is, for problems found inside a value the config
// holds as it is (a tool's parameters schema, checked by the agent).
func (d *decoder) record(n *yaml.Node, path string) {
	d.src.at[path] = n
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			d.record(n.Content[i+1], join(path, n.Content[i].Value))
		}
	case yaml.SequenceNode:
		for i, el := range n.Content {
			d.record(el, fmt.Sprintf("%s[%d]", path, i))
		}
	}
}

// jsonable turns the maps yaml gives for non-string keys into string-keyed ones.
func jsonable(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = jsonable(e)
		}
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range t {
			t[i] = jsonable(e)
		}
	}
	return v
}

func (d *decoder) scalar(n *yaml.Node, v reflect.Value, path string) {
	msg := mismatch(n, v)
	if n.Kind == yaml.ScalarNode {
		msg = setScalar(n, v)
	}
	if msg != "" {
		d.fail(n, path, "%s", msg)
	}
}

// setScalar sets v to the scalar n, or says why it cannot.
func setScalar(n *yaml.Node, v reflect.Value) string {
	numeric := n.ShortTag() == "!!int" || n.ShortTag() == "!!float"
	switch k := v.Kind(); {
	case k == reflect.String:
		// A number or boolean where a string is expected keeps the text written (cpu: 1,
		// system_prompt: true), as sigs.k8s.io/yaml, the reader before this one, did.
		v.SetString(n.Value)
		return ""
	case k == reflect.Bool:
		return setBool(n, v)
	case k >= reflect.Int && k <= reflect.Int64 && numeric:
		return setInt(n, v)
	case (k == reflect.Float64 || k == reflect.Float32) && numeric:
		return setFloat(n, v)
	}
	return mismatch(n, v)
}

func setBool(n *yaml.Node, v reflect.Value) string {
	meant := yaml11Bools[strings.ToLower(n.Value)]
	switch {
	case n.ShortTag() == "!!bool":
		v.SetBool(n.Value == "true" || n.Value == "True" || n.Value == "TRUE")
		return ""
	case meant != "" && n.ShortTag() == "!!str":
		return fmt.Sprintf("expected true or false, got %s: YAML 1.2 reads it as text; write %s", describe(n), meant)
	}
	return mismatch(n, v)
}

func setInt(n *yaml.Node, v reflect.Value) string {
	i, ok := integer(n)
	limit := int64(1)<<(v.Type().Bits()-1) - 1
	switch {
	case !ok && digits.MatchString(n.Value), ok && v.OverflowInt(i):
		return fmt.Sprintf("%s is out of range; at most %d", n.Value, limit)
	case !ok:
		return "expected an integer, got " + describe(n)
	}
	v.SetInt(i)
	return ""
}

// digits is an integer written out, too large for int64 when integer cannot read it.
var digits = regexp.MustCompile(`^[-+]?[0-9]+$`)

func setFloat(n *yaml.Node, v reflect.Value) string {
	var f float64
	if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return n.Value + " is not a finite number"
	}
	v.SetFloat(f)
	return ""
}

// mismatch says that n is not of v's kind.
func mismatch(n *yaml.Node, v reflect.Value) string {
	return fmt.Sprintf("expected %s, got %s", kindName(v.Kind()), describe(n))
}

// yaml11Bools are the booleans of YAML 1.1 (sigs.k8s.io/yaml read them) that YAML 1.2 reads as
// text, with the boolean each meant.
var yaml11Bools = map[string]string{"y": "true", "yes": "true", "on": "true", "n": "false", "no": "false", "off": "false"}

// integer reads an integer, or a number with no fraction written as a float (1e8), as
// sigs.k8s.io/yaml did.
func integer(n *yaml.Node) (int64, bool) {
	var i int64
	if n.ShortTag() == "!!int" {
		err := n.Decode(&i)
		return i, err == nil
	}
	var f float64
	if err := n.Decode(&f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int64(f), true
}

// kindName is what a Go kind is called in a config file.
func kindName(k reflect.Kind) string {
	switch {
	case k == reflect.String:
		return "a string"
	case k == reflect.Bool:
		return "true or false"
	case k >= reflect.Int && k <= reflect.Int64, k >= reflect.Uint && k <= reflect.Uint64:
		return "an integer"
	case k == reflect.Float32 || k == reflect.Float64:
		return "a number"
	case k == reflect.Slice:
		return "a list"
	}
	return "a mapping"
}

// describe is what a node is, in the words of kindName, with the value when it is a scalar.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return describe(n.Alias)
	}
	what := map[string]string{"!!str": "a string", "!!int": "an integer", "!!float": "a number", "!!bool": "a boolean", "!!null": "null"}[n.ShortTag()]
	if what == "" {
		what = "a " + strings.TrimPrefix(n.ShortTag(), "!!")
	}
	v := withoutCredentials(n.Value) // before the cut, which may leave a password and drop its '@'
	if len(v) > 40 {
		v = textcut.Head(v, 40) + "…"
	}
	if n.ShortTag() == "!!str" {
		v = strconv.Quote(v)
	}
	return what + " " + v
}

// withoutCredentials is s, quoted back in an error, with what precedes the last '@' of each
// comma-separated part replaced by "redacted" (a URL's scheme kept): a NATS URL may carry a
// user and password or a token (docs/security.md), and a value written in the wrong place,
// such as "nats: nats://user:password@host", must not bring it into the worker's log or
// check-config's output.
func withoutCredentials(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		at := strings.LastIndex(p, "@")
		if at < 0 {
			continue
		}
		scheme := ""
		if j := strings.Index(p, "://"); j >= 0 && j < at {
			scheme = p[:j+len("://")]
		}
		parts[i] = scheme + "redacted@" + p[at+1:]
	}
	return strings.Join(parts, ",")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// fieldIndex maps the config names of t's fields (their json tags) to their index.
func fieldIndex(t reflect.Type) map[string]int {
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		if name := fieldName(t.Field(i)); name != "" {
			m[name] = i
		}
	}
	return m
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if name := fieldName(t.Field(i)); name != "" {
			names = append(names, name)
		}
	}
	return names
}

func fieldName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if !f.IsExported() || name == "-" {
		return ""
	}
	if name == "" {
		return f.Name
	}
	return name
}

// suggest is " (did you mean "x"?)" for the known name closest to key when it is close enough
// to be a typo, else the names that are allowed here.
func suggest(key string, known []string) string {
	best, dist := "", math.MaxInt
	for _, k := range known {
		if d := editDistance(strings.ToLower(key), k); d < dist {
			best, dist = k, d
		}
	}
	if best != "" && dist <= max(1, len(key)/3) {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return "; keys here: " + strings.Join(slices.Sorted(slices.Values(known)), ", ")
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
