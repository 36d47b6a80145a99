package job

import (
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// checkBytes refuses a message that is not UTF-8, naming the first byte that is not:
// encoding/json puts U+FFFD in its place, so the job run and recorded would not be the bytes
// the submitter sent.
func checkBytes(data []byte) error {
	if utf8.Valid(data) {
		return nil
	}
	at := 0
	for at < len(data) {
		r, n := utf8.DecodeRune(data[at:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		at += n
	}
	return fmt.Errorf("%w: the message is not UTF-8 (byte %d, 0x%02x); JSON text is UTF-8", ErrInvalid, at, data[at])
}

// exactKeys refuses the keys encoding/json lets through and the contract does not: one given
// twice in an object (json takes the last, another reader of the same bytes may take the first)
// and one spelled otherwise than its field ("ID", "ſubmitted_at": json folds case and a few
// Unicode letters), which the schema refuses as unknown. data has decoded into a Job already,
// so its shape is the type's.
func exactKeys(data []byte) error {
	w := keyWalker{data: data}
	return w.value(reflect.TypeFor[Job]())
}

// keyWalker reads a message's values from its text, which encoding/json has read already, so
// valid JSON, and knows where it is for an error: a path is made only for one, since every job
// is decoded on the worker's path.
type keyWalker struct {
	data []byte
	pos  int
	path []pathStep
}

// pathStep is a member's key, or an array's index when index >= 0.
type pathStep struct {
	key   string
	index int
}

// at is where the walk is in the message: "inputs[0].size", "" at the top.
func (w *keyWalker) at() string {
	at := ""
	for _, s := range w.path {
		if s.index >= 0 {
			at = fmt.Sprintf("%s[%d]", at, s.index)
		} else {
			at = strings.TrimPrefix(at+"."+s.key, ".")
		}
	}
	return at
}

// next is the next character after white space, 0 at the end.
func (w *keyWalker) next() byte {
	for w.pos < len(w.data) {
		switch c := w.data[w.pos]; c {
		case ' ', '\t', '\r', '\n':
			w.pos++
		default:
			return c
		}
	}
	return 0
}

// value reads one value, t its type in Job (nil: any).
func (w *keyWalker) value(t reflect.Type) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch w.next() {
	case '[':
		var elem reflect.Type
		if t != nil && t.Kind() == reflect.Slice {
			elem = t.Elem()
		}
		return w.array(elem)
	case '{':
		return w.object(t)
	case '"':
		_, err := w.str()
		return err
	}
	// A number, true, false or null: up to the next delimiter.
	for w.pos < len(w.data) && !strings.ContainsRune(",]} \t\r\n", rune(w.data[w.pos])) {
		w.pos++
	}
	return nil
}

func (w *keyWalker) array(elem reflect.Type) error {
	w.pos++ // '['
	for i := 0; ; i++ {
		if w.next() == ']' {
			w.pos++
			return nil
		}
		if i > 0 {
			if err := w.expect(','); err != nil {
				return err
			}
		}
		w.path = append(w.path, pathStep{index: i})
		if err := w.value(elem); err != nil {
			return err
		}
		w.path = w.path[:len(w.path)-1]
	}
}

// object reads the members of an object of type t (a struct: its json names are its keys;
// a map: any key) up to its closing '}'.
func (w *keyWalker) object(t reflect.Type) error {
	w.pos++ // '{'
	fields := jsonFields(t)
	var seen keySet
	for first := true; ; first = false {
		if w.next() == '}' {
			w.pos++
			return nil
		}
		if !first {
			if err := w.expect(','); err != nil {
				return err
			}
			w.next()
		}
		key, err := w.str()
		if err != nil {
			return err
		}
		if err := w.expect(':'); err != nil {
			return err
		}
		ft, known := fields[key]
		switch {
		case seen.has(key):
			w.path = append(w.path, pathStep{key: key, index: -1})
			return bad(w.at(), "is given twice; give each key once")
		case t != nil && t.Kind() == reflect.Map:
			ft = t.Elem()
		case fields != nil && !known:
			return fmt.Errorf("%w: %s%q is not a key of the job message; keys are spelled as job-message.md has them, in lowercase", ErrInvalid, within(w.at()), key)
		}
		seen.add(key)
		w.path = append(w.path, pathStep{key: key, index: -1})
		if err := w.value(ft); err != nil {
			return err
		}
		w.path = w.path[:len(w.path)-1]
	}
}

func (w *keyWalker) expect(c byte) error {
	if w.next() != c {
		return fmt.Errorf("%w: %s: expected %q at byte %d", ErrInvalid, cmp.Or(w.at(), "the message"), c, w.pos)
	}
	w.pos++
	return nil
}

// str reads a string at pos and returns its characters: those between the quotes, or the
// string decoded when it has an escape.
func (w *keyWalker) str() (string, error) {
	start := w.pos
	escaped := false
	for i := start + 1; i < len(w.data); i++ {
		switch w.data[i] {
		case '\\':
			escaped = true
			i++
		case '"':
			w.pos = i + 1
			if !escaped {
				return string(w.data[start+1 : i]), nil
			}
			var s string
			if err := json.Unmarshal(w.data[start:i+1], &s); err != nil {
				return "", fmt.Errorf("%w: %v", ErrInvalid, err)
			}
			return s, nil
		}
	}
	return "", fmt.Errorf("%w: a string at byte %d has no end", ErrInvalid, start)
}

// keySet is the keys of one object so far: a few in a slice, as most objects have, and a map
// past that, so that an object of many keys costs no more than a map.
type keySet struct {
	few  []string
	many map[string]bool
}

func (s *keySet) has(key string) bool {
	return s.many[key] || (s.many == nil && slices.Contains(s.few, key))
}

func (s *keySet) add(key string) {
	if s.many == nil && len(s.few) < 16 {
		s.few = append(s.few, key)
		return
	}
	if s.many == nil {
		s.many = make(map[string]bool, 2*len(s.few))
		for _, k := range s.few {
			s.many[k] = true
		}
	}
	s.many[key] = true
}

// jsonFields maps the json names of struct type t's fields to their types; nil when t is no
// struct. Made once a type.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	if f, ok := fieldsOf.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			fields[name] = f.Type
		}
	}
	fieldsOf.Store(t, fields)
	return fields
}

var fieldsOf sync.Map // reflect.Type → map[string]reflect.Type

// within is the path of an object in the message, as an error's prefix: "" at the top.
func within(at string) string {
	if at == "" {
		return ""
	}
	return at + ": "
}

// checkEscapes refuses a string escape that is half of a UTF-16 surrogate pair with no other
// half ("\udc00", "\ud800x"): encoding/json decodes it to U+FFFD, while another reader of the
// same bytes keeps it or refuses the message, so the job run would not be the job sent. data
// is valid JSON, so a backslash is always inside a string and starts an escape.
func checkEscapes(data []byte) error {
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		if data[i+1] != 'u' {
			i++ // a one-letter escape, "\\" among them
			continue
		}
		r := hex4(data[i+2 : i+6])
		switch {
		case r >= 0xd800 && r < 0xdc00 && i+12 <= len(data) && data[i+6] == '\\' && data[i+7] == 'u' &&
			hex4(data[i+8:i+12]) >= 0xdc00 && hex4(data[i+8:i+12]) < 0xe000:
			i += 11 // a pair: one character
		case r >= 0xd800 && r < 0xe000:
			return fmt.Errorf("%w: %s at byte %d is half of a UTF-16 surrogate pair, no character; write the character itself or its whole pair", ErrInvalid, data[i:i+6], i)
		default:
			i += 5
		}
	}
	return nil
}

// hex4 is the value of four hex digits, which valid JSON has after "\u".
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}
