package provenance

import (
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/boxcar-run/boxcar/internal/job"
)

// appendJCS appends v, at depth in the document, in canonical JSON: the bytes json.Marshal
// and then canonicalJSON give, without the text in between. A manifest is built on every
// commit, and reading back the text encoding/json wrote was half of building it. What a
// manifest's own types hold is written here: structs, pointers, slices, maps with string
// keys, strings, integers and booleans. Anything else (a type with its own MarshalJSON or
// MarshalText, an interface, a float, a json.Number, bytes, an embedded field, a `string`
// option) takes the long way for that value, so it comes out as encoding/json writes it.
// TestEncoderMatchesMarshal holds the two together.
func appendJCS(out []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxDepth)
	}
	switch v.Type() {
	case timeType:
		return appendTime(out, v, depth)
	case durationType:
		return appendString(out, time.Duration(v.Int()).String()) // as its MarshalJSON writes it
	case numberType:
		return appendLongWay(out, v, depth) // a string encoding/json writes as the number it spells
	}
	if ownEncoding(v) {
		return appendLongWay(out, v, depth)
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return append(out, "null"...), nil
		}
		if v.Elem().Kind() == reflect.Pointer {
			// A pointer to a pointer adds no depth, and one to itself never ends: encoding/json
			// looks for the cycle.
			return appendLongWay(out, v, depth)
		}
		return appendJCS(out, v.Elem(), depth)
	case reflect.Struct:
		return appendStruct(out, v, depth)
	case reflect.Map:
		return appendMap(out, v, depth)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return appendLongWay(out, v, depth) // base64
		}
		if v.IsNil() {
			return append(out, "null"...), nil
		}
		return appendArray(out, v, depth)
	case reflect.Array:
		return appendArray(out, v, depth)
	}
	return appendScalar(out, v, depth)
}

// appendScalar writes a string, a boolean or an integer; anything else the long way.
func appendScalar(out []byte, v reflect.Value, depth int) ([]byte, error) {
	switch v.Kind() {
	case reflect.String:
		return appendString(out, validUTF8(v.String()))
	case reflect.Bool:
		return strconv.AppendBool(out, v.Bool()), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.AppendInt(out, v.Int(), 10), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		// A bigger one is a double's digits in canonical form.
		if u := v.Uint(); u <= math.MaxInt64 {
			return strconv.AppendUint(out, u, 10), nil
		}
	}
	return appendLongWay(out, v, depth)
}

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
	isZeroerType      = reflect.TypeFor[interface{ IsZero() bool }]()
)

// ownEncoding reports whether encoding/json would write v with its type's own method.
func ownEncoding(v reflect.Value) bool {
	m := methodsOf(v.Type())
	return m.value || (m.pointer && v.CanAddr())
}

// methods says whether a type's values, or its pointers, encode themselves.
type methods struct{ value, pointer bool }

var typeMethods sync.Map // reflect.Type → methods

func methodsOf(t reflect.Type) methods {
	if noMethods(t) {
		return methods{}
	}
	if m, ok := typeMethods.Load(t); ok {
		return m.(methods)
	}
	p := reflect.PointerTo(t)
	m := methods{
		value:   t.Implements(marshalerType) || t.Implements(textMarshalerType),
		pointer: p.Implements(marshalerType) || p.Implements(textMarshalerType),
	}
	typeMethods.Store(t, m)
	return m
}

// noMethods reports a type that has no methods, nor has its pointer, told from the type
// alone: a predeclared one (string, int64, bool) and an unnamed slice, map or array (methods
// are declared on defined types, and promoted only through a struct's embedded fields). Most
// of a manifest's values are of these, and telling it here is cheaper than typeMethods' look.
func noMethods(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Slice, reflect.Map, reflect.Array:
		return t.Name() == ""
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.String:
		return t.PkgPath() == ""
	}
	return false
}

var (
	timeType     = reflect.TypeFor[time.Time]()
	durationType = reflect.TypeFor[job.Duration]()
	numberType   = reflect.TypeFor[json.Number]()
)

// appendTime writes a time as its MarshalJSON does, RFC 3339 with nanoseconds, which the
// canonical form keeps as it is; a time that method refuses goes the long way to be refused.
func appendTime(out []byte, v reflect.Value, depth int) ([]byte, error) {
	t := v.Interface().(time.Time)
	_, offset := t.Zone()
	if y := t.Year(); y < 0 || y > 9999 || offset <= -24*3600 || offset >= 24*3600 {
		return appendLongWay(out, v, depth)
	}
	out = append(out, '"')
	out = t.AppendFormat(out, time.RFC3339Nano)
	return append(out, '"'), nil
}

// appendLongWay writes v as json.Marshal does, in canonical form. An addressable value goes
// by its address, so that a method on the pointer is used as encoding/json uses it there.
func appendLongWay(out []byte, v reflect.Value, depth int) ([]byte, error) {
	x := v.Interface()
	if v.CanAddr() {
		x = v.Addr().Interface()
	}
	data, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	return appendCanonicalAt(out, data, depth)
}

func appendArray(out []byte, v reflect.Value, depth int) ([]byte, error) {
	out = append(out, '[')
	for i := range v.Len() {
		if i > 0 {
			out = append(out, ',')
		}
		var err error
		if out, err = appendJCS(out, v.Index(i), depth+1); err != nil {
			return nil, err
		}
	}
	return append(out, ']'), nil
}

func appendMap(out []byte, v reflect.Value, depth int) ([]byte, error) {
	if v.Type().Key().Kind() != reflect.String {
		return appendLongWay(out, v, depth)
	}
	if v.IsNil() {
		return append(out, "null"...), nil
	}
	type entry struct {
		name  []byte
		value reflect.Value
	}
	entries := make([]entry, 0, v.Len())
	for it := v.MapRange(); it.Next(); {
		entries = append(entries, entry{[]byte(validUTF8(it.Key().String())), it.Value()})
	}
	slices.SortFunc(entries, func(a, b entry) int { return compareUTF16(a.name, b.name) })
	out = append(out, '{')
	for i, e := range entries {
		if i > 0 {
			if string(e.name) == string(entries[i-1].name) {
				return nil, fmt.Errorf("member %q appears twice", e.name)
			}
			out = append(out, ',')
		}
		var err error
		if out, err = appendString(out, e.name); err != nil {
			return nil, err
		}
		out = append(out, ':')
		if out, err = appendJCS(out, e.value, depth+1); err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

func appendStruct(out []byte, v reflect.Value, depth int) ([]byte, error) {
	plan := structPlanOf(v.Type())
	if plan.longWay {
		return appendLongWay(out, v, depth)
	}
	return appendMembers(out, v, plan, func(out []byte, f planField, fv reflect.Value) ([]byte, error) {
		return appendField(out, f, fv, depth+1)
	})
}

// appendField writes a field's value at depth: one of a scalar type (planField.scalar) as
// appendJCS would, without asking its type again what it is.
func appendField(out []byte, f planField, fv reflect.Value, depth int) ([]byte, error) {
	if f.scalar && depth <= maxDepth {
		return appendScalar(out, fv, depth)
	}
	return appendJCS(out, fv, depth)
}

// appendMembers writes an object of v's fields as plan orders and omits them, each field's
// value by value.
func appendMembers(out []byte, v reflect.Value, plan *structPlan, value func([]byte, planField, reflect.Value) ([]byte, error)) ([]byte, error) {
	out = append(out, '{')
	first := true
	for _, f := range plan.fields {
		fv := v.Field(f.index)
		if f.omit(fv) {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, f.head...)
		var err error
		if out, err = value(out, f, fv); err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

// structPlan is how a struct type is written: its fields in canonical order, or the long way
// when it has a field whose rules appendJCS does not follow.
type structPlan struct {
	fields  []planField
	longWay bool
}

type planField struct {
	name      string
	head      string // `"name":`
	index     int
	omitEmpty bool
	omitZero  bool
	isZeroer  bool // its type's IsZero method says what omitzero omits
	// scalar: the field's type is a string, boolean or integer one that encodes by no method
	// of its own, which appendJCS writes with appendScalar (appendField).
	scalar bool
}

// omit follows encoding/json's omitempty and omitzero.
func (f planField) omit(v reflect.Value) bool {
	if f.omitZero {
		if f.isZeroer && v.Interface().(interface{ IsZero() bool }).IsZero() || !f.isZeroer && v.IsZero() {
			return true
		}
	}
	if !f.omitEmpty {
		return false
	}
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

var structPlans sync.Map // reflect.Type → *structPlan

func structPlanOf(t reflect.Type) *structPlan {
	if p, ok := structPlans.Load(t); ok {
		return p.(*structPlan)
	}
	p := newStructPlan(t)
	structPlans.Store(t, p)
	return p
}

func newStructPlan(t reflect.Type) *structPlan {
	p := &structPlan{}
	for i := range t.NumField() {
		f, written, ok := planFieldOf(t.Field(i), i)
		if !ok {
			return &structPlan{longWay: true}
		}
		if written {
			p.fields = append(p.fields, f)
		}
	}
	slices.SortFunc(p.fields, func(a, b planField) int { return strings.Compare(a.name, b.name) })
	for i := 1; i < len(p.fields); i++ {
		if p.fields[i].name == p.fields[i-1].name {
			return &structPlan{longWay: true} // encoding/json's rules pick one, or none
		}
	}
	return p
}

// planFieldOf is how field number i is written: written is false for a field encoding/json
// leaves out, ok false for one whose rules appendJCS does not follow.
func planFieldOf(sf reflect.StructField, i int) (f planField, written, ok bool) {
	tag := sf.Tag.Get("json")
	switch {
	case sf.Anonymous:
		return f, false, false // embedded fields have rules of their own
	case !sf.IsExported() || tag == "-":
		return f, false, true
	}
	name, opts, _ := strings.Cut(tag, ",")
	if name == "" {
		name = sf.Name
	}
	f = planField{name: name, head: `"` + name + `":`, index: i,
		omitEmpty: hasOption(opts, "omitempty"), omitZero: hasOption(opts, "omitzero")}
	ft := sf.Type
	f.scalar = scalarType(ft)
	switch {
	case hasOption(opts, "string") || !plainName(name):
		return f, false, false
	case f.omitZero && ft.Kind() != reflect.Interface && ft.Kind() != reflect.Pointer && ft.Implements(isZeroerType):
		f.isZeroer = true
	case f.omitZero && (ft.Implements(isZeroerType) || reflect.PointerTo(ft).Implements(isZeroerType)):
		return f, false, false
	}
	return f, true, true
}

// scalarType reports a string, boolean or integer type that encodes by no method of its own
// (planField.scalar).
func scalarType(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr, reflect.String:
		return t != durationType && t != numberType && methodsOf(t) == methods{}
	}
	return false
}

func hasOption(opts, name string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == name {
			return true
		}
	}
	return false
}

// plainName: letters, digits and underscores, whose order is their bytes' and which need no
// escape.
func plainName(name string) bool {
	for i := range len(name) {
		if c := name[i]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// validUTF8 is s with each byte that is not UTF-8 made U+FFFD, as encoding/json writes it.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
