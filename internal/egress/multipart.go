package egress

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"sync/atomic"
)

// multipartBody passes a multipart body (multipart/form-data, or any multipart/ type: Rack
// reads multipart/mixed and /related as forms) on as it reads it, holding back only what could
// still be a _method part, and fails its read at one naming TRACE, TRACK or CONNECT
// (formRefusal), as formBody does for a URL-encoded form. It needs no boundary: PHP reads the
// one after the first "boundary" of the Content-Type, Rack the last "boundary=", so a reading
// by the boundary is one spelling from a bypass. A part is a _method one where a name
// (partNames), read on to its header line's end, folded lines too, is _method in any way
// PHP, Rack or busboy reads one (methodPartName); its value runs from the header block's
// blank line to the first "--", which every reading's delimiter starts with, so each server's
// value is that or longer, and a longer one holds "--" and names no method. A value of more
// than maxFormBytes without "--" is no method, and goes on; a name past as many spaces, or a
// _method part's header block over them, is refused (overForm): a file whose bytes name a
// _method with no blank line in the 64 KiB after is refused so too.
type multipartBody struct {
	io.ReadCloser
	buf   []byte
	out   []byte // released: read, checked, not yet returned
	held  []byte // from a name (partNames) on, or the last bytes that may begin one
	state partState
	mark  int // where in held the current state's item begins
	seen  int // how far in held the current state's search has looked, for each read's next
	err   error
	cut   atomic.Bool
}

type partState int

const (
	partScan  partState = iota // looking for a name (partNames)
	partName                   // reading a name to its header line's end
	partHead                   // a _method part's header block, to its blank line
	partValue                  // a _method part's value, to the first "--"
)

// Close closes the body, but for one refused (formBody.Close).
func (m *multipartBody) Close() error {
	if m.cut.Load() {
		return nil
	}
	return m.ReadCloser.Close()
}

// Read returns released bytes, reading and scanning more while none are.
func (m *multipartBody) Read(p []byte) (int, error) {
	for len(m.out) == 0 {
		if m.err != nil {
			return 0, m.err
		}
		if m.buf == nil {
			m.buf = make([]byte, 32<<10)
		}
		n, err := m.ReadCloser.Read(m.buf)
		m.held = append(m.held, m.buf[:n]...)
		for m.err == nil && m.step(false) {
		}
		if err != nil && m.err == nil {
			for errors.Is(err, io.EOF) && m.err == nil && m.step(true) {
			}
			if m.err == nil {
				m.release(len(m.held))
				m.err = err
			}
		}
	}
	n := copy(p, m.out)
	m.out = m.out[n:]
	return n, nil
}

// step moves the scan on by one item of held and reports whether it did; at the body's end
// (eof) a name or a value is read to it.
func (m *multipartBody) step(eof bool) bool {
	switch m.state {
	case partScan:
		i, n := indexName(m.held)
		if i < 0 {
			m.release(max(len(m.held)-len("content-id:")+1, 0))
			return false
		}
		m.release(i)
		m.next(partName, n)
	case partName:
		return m.stepName(eof)
	case partHead:
		from := m.from()
		i, n := blankLine(m.held[from:])
		if i < 0 || from+i > maxFormBytes { // found past the cap, as if read a byte at a time
			return m.over(max(len(m.held), from+i))
		}
		m.next(partValue, from+i+n)
	case partValue:
		return m.stepValue(eof)
	}
	return true
}

// stepName reads the name held from m.mark to its header line's end, or to the next name
// before it: read in turn, that one is checked whole, and no name is read through another,
// which a _method's leading spaces, 7 letters and NUL never hold. Read to the line's end, each
// name of a line of many was read to the same end, 64 KiB for a long line: 256 KiB of "name="
// took minutes (TestMultipartBodyDenseWithNamesGoesOn).
func (m *multipartBody) stepName(eof bool) bool {
	kwFrom := max(m.mark, m.seen-len("content-id:")+1) // a name the last read split
	from := m.from()
	b := m.held
	if k, _ := indexName(b[kwFrom:]); k >= 0 {
		b, eof = b[:kwFrom+k], true // the line ends there, at the latest
	}
	end, ok := headerLineEnd(b, m.mark, from, eof)
	if !ok && len(m.held)-m.mark <= maxFormBytes {
		return false
	}
	if !ok || end-m.mark > maxFormBytes {
		// A long line (a minified script's "a.name=..."): a name is read in its first 64 KiB
		// and a byte, however the body's reads split it, and a longer one is no _method, but
		// for one past 64 KiB of spaces.
		end = m.mark + maxFormBytes + 1
		if len(bytes.TrimLeft(m.held[m.mark:end], " \t\r\n\"'")) == 0 {
			return m.over(end - m.mark)
		}
	}
	if !methodPartName(m.held[m.mark:end]) {
		m.release(m.mark) // a name inside it is read in turn
		m.next(partScan, 0)
		return true
	}
	m.next(partHead, end)
	return true
}

// stepValue reads a _method part's value, held from m.mark to the first "--".
func (m *multipartBody) stepValue(eof bool) bool {
	from := m.from()
	i := bytes.Index(m.held[from:], []byte("--"))
	if i >= 0 {
		i += from - m.mark
	}
	if i > maxFormBytes { // found past the cap: read as if the reads had cut it there
		i = -1
	}
	switch {
	case i < 0 && len(m.held)-m.mark > maxFormBytes: // no method: it goes on
		m.release(m.mark)
		m.next(partScan, 0)
		return true
	case i < 0 && eof:
		i = len(m.held) - m.mark
	case i < 0:
		return false
	}
	if v := refuseOverride([]string{strings.Trim(string(m.held[m.mark:m.mark+i]), " \t\r\n")}); v != nil {
		m.refuse(v)
		return false
	}
	m.release(m.mark + i)
	m.next(partScan, 0)
	return true
}

// over refuses a name or header block held over maxFormBytes; it reports false, no step.
func (m *multipartBody) over(n int) bool {
	if n > maxFormBytes {
		m.refuse(overForm)
	}
	return false
}

func (m *multipartBody) refuse(v *verdict) {
	m.err, m.out, m.held = &formRefusal{v}, nil, nil
	m.cut.Store(true)
}

// release lets held's first n bytes go on.
func (m *multipartBody) release(n int) {
	m.out = append(m.out, m.held[:n]...)
	m.held = m.held[n:] // not moved down: a body of many names would be copied once for each
	m.mark, m.seen = max(m.mark-n, 0), max(m.seen-n, 0)
}

// from is where the current state's search goes on: back far enough to find a line end or a
// "--" the last read split, and never before mark.
func (m *multipartBody) from() int {
	from := max(m.mark, m.seen-2)
	m.seen = len(m.held)
	return from
}

// next moves to state s, whose item begins at mark.
func (m *multipartBody) next(s partState, mark int) {
	m.state, m.mark, m.seen = s, mark, 0
}

// partNames are what a part's name follows, in any case: Content-Disposition's name
// parameter, RFC 2231's name* (busboy, so Express's multer, decodes it), and a Content-ID,
// which Rack takes for the name of a part that has none.
var partNames = [][]byte{[]byte("name="), []byte("name*="), []byte("content-id:")}

// indexName is the index in b of the first of partNames, and its length, or -1.
func indexName(b []byte) (int, int) {
	for i := range b {
		if c := b[i] | 0x20; c != 'n' && c != 'c' {
			continue
		}
		for _, s := range partNames {
			if i+len(s) <= len(b) && bytes.EqualFold(b[i:i+len(s)], s) {
				return i, len(s)
			}
		}
	}
	return -1, 0
}

// headerLineEnd is the end of the header line b[start:] is on: its first LF, looked for from
// from on, that no space or tab follows (a folded line goes on), less a CR before it. ok is
// false while the line may go on; at the body's end (eof) it ends there.
func headerLineEnd(b []byte, start, from int, eof bool) (int, bool) {
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i+1 == len(b) && !eof {
			return 0, false
		}
		if i+1 == len(b) || b[i+1] != ' ' && b[i+1] != '\t' {
			if i > start && b[i-1] == '\r' {
				i--
			}
			return i, true
		}
	}
	return len(b), eof
}

// blankLine is where the first blank line of b ends the header block: the index of its LF
// before it, and the length of the line ends from there ("\n\n" or "\n\r\n"), or -1.
func blankLine(b []byte) (int, int) {
	for i := 0; i+1 < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case b[i+1] == '\n':
			return i, 2
		case b[i+1] == '\r' && i+2 < len(b) && b[i+2] == '\n':
			return i, 3
		}
	}
	return -1, 0
}

// methodPartName reports whether a part's name, raw (what follows one of partNames up to the
// header line's end or the next name), is one PHP, Rack or busboy may read as "_method":
// unfolded with and without the fold's spaces; quoted with " or ' to the closing quote or not,
// and with its backslash escapes read (Rack 3 and busboy read "\_method" as _method); up to a
// ";" (PHP splits the parameters at ";" before it reads quotes), a quote or any space (PHP ends
// an unquoted value at isspace, a vertical tab, form feed or CR alone too, and Rack strips
// them); after the last "'" (RFC 2231 puts the charset and language before the name, each
// ended by one); each as overrideName reads a form's name.
func methodPartName(raw []byte) bool {
	if !mayNameMethod(raw) {
		return false // most names: no allocation for them (a body dense with names)
	}
	s := string(raw)
	for _, u := range []string{unfold(s, false), unfold(s, true)} {
		u = strings.TrimLeft(u, " \t")
		var names []string
		if u != "" && (u[0] == '"' || u[0] == '\'') {
			inner := u[1:]
			if i := strings.IndexByte(inner, u[0]); i >= 0 {
				inner = inner[:i]
			}
			names = append(names, inner, unescapeQuoted(u[1:], u[0]))
			u = inner
		}
		names = append(names, u)
		if i := strings.LastIndexByte(u, '\''); i >= 0 {
			names = append(names, u[i+1:]) // name*=utf-8''%5Fmethod
		}
		if i := strings.IndexAny(u, "; \t\r\n\v\f\"'"); i >= 0 {
			names = append(names, u[:i])
		}
		if i := strings.IndexByte(u, ';'); i >= 0 {
			names = append(names, u[:i])
		}
		for _, n := range names {
			if overrideName(n) {
				return true
			}
		}
	}
	return false
}

// mayNameMethod reports whether raw may hold a name methodPartName reads as _method: such a
// name has the letters of "method" in a row, unless a percent escape, a backslash escape or a
// folded line end is between them.
func mayNameMethod(raw []byte) bool {
	if bytes.ContainsAny(raw, "%\\\n") {
		return true
	}
	for i := 0; i+len("method") <= len(raw); i++ {
		if raw[i]|0x20 == 'm' && bytes.EqualFold(raw[i:i+len("method")], []byte("method")) {
			return true
		}
	}
	return false
}

// unescapeQuoted is the quoted string s, its opening quote taken off, as Rack 3 and busboy
// read it: to its first quote no backslash escapes, each backslash escape the byte after it.
func unescapeQuoted(s string, quote byte) string {
	var b strings.Builder
	for i := 0; i < len(s) && s[i] != quote; i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unfold joins a folded header line: its line ends taken out, with the spaces that begin the
// next line or without them.
func unfold(s string, dropSpace bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n', s[i] == '\n':
			if s[i] == '\r' {
				i++
			}
			for dropSpace && i+1 < len(s) && (s[i+1] == ' ' || s[i+1] == '\t') {
				i++
			}
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
