package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
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
	dec := json.NewDecoder(bytes.NewReader(data))
	return walkKeys(dec, reflect.TypeFor[Job](), "")
}

// walkKeys reads one value from dec, t its type in Job (nil: any), at its path in the message.
func walkKeys(dec *json.Decoder, t reflect.Type, at string) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch tok {
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && t.Kind() == reflect.Slice {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walkKeys(dec, elem, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case json.Delim('{'):
		if err := walkObject(dec, t, at); err != nil {
			return err
		}
	default:
		return nil // a string, number, boolean or null
	}
	_, err = dec.Token() // the ']' or '}'
	return err
}

// walkObject reads the members of an object of type t (a struct: its json names are its keys;
// a map: any key) up to its closing '}'.
func walkObject(dec *json.Decoder, t reflect.Type, at string) error {
	fields := jsonFields(t)
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		key, _ := tok.(string)
		path := strings.TrimPrefix(at+"."+key, ".")
		ft, known := fields[key]
		switch {
		case seen[key]:
			return bad(path, "is given twice; give each key once")
		case t != nil && t.Kind() == reflect.Map:
			ft = t.Elem()
		case fields != nil && !known:
			return fmt.Errorf("%w: %s%q is not a key of the job message; keys are spelled as job-message.md has them, in lowercase", ErrInvalid, within(at), key)
		}
		seen[key] = true
		if err := walkKeys(dec, ft, path); err != nil {
			return err
		}
	}
	return nil
}

// jsonFields maps the json names of struct type t's fields to their types; nil when t is no
// struct.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			fields[name] = f.Type
		}
	}
	return fields
}

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
