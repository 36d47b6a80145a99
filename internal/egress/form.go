package egress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// maxFormBytes is the most of a form's parameter name, or of a _method parameter's value, the
// proxy holds back while it reads a form body for its _method (formBody).
const maxFormBytes = 64 << 10

// overForm refuses a form with a name, or a _method value, over maxFormBytes: no server's
// framework takes one, and holding it would hold the upload.
var overForm = refuse(ReasonMethod, fmt.Sprintf("a form parameter's name, or a _method's value, over %d KiB: the proxy holds each whole to read it; send such a body in another encoding", maxFormBytes>>10))

// formRefusal ends the read of a form body that names a refused method: the request is cut
// there, and the connection it went on closed before the body's end, so no server acts on it.
// Its verdict is the request's decision (outcome).
type formRefusal struct{ v *verdict }

func (e *formRefusal) Error() string { return "egress: the form body refused: " + e.v.detail }

// formBody passes a URL-encoded form body on as it reads it, holding back only what could
// still be a _method parameter: the current pair's name until its "=" or separator says what
// it is (overrideName), and a _method pair whole until its end, when its value is read
// (methodParams, the one reading of names and values). A form of any size goes on as it came,
// byte for byte (TestLargeFormGoesOn); one naming TRACE, TRACK or CONNECT fails its read
// there (formRefusal), past any length of other parameters (TestFormOverrideLateIsCut).
type formBody struct {
	io.ReadCloser
	buf   []byte
	out   []byte // released: read, checked, not yet returned
	held  []byte // the current pair as far as read, while it may be a _method one
	name  int    // the held name's length once its "=" is read, a _method pair's; 0 before
	value bool   // inside the value of a pair that is no _method one: it goes on as it comes
	err   error
	cut   atomic.Bool // refused: Close leaves the rest of the body unread
}

// Close closes the body, but for one refused: closing a request's body reads it to its end on
// a kept-alive connection, and the refusal waited for the rest of it, up to idle_timeout for a
// sandbox that sends it once answered (TestFormOverrideAnsweredBeforeTheBodysEnd). The
// refusal ends the connection, which reads what is left, bounded (lingerClose).
func (f *formBody) Close() error {
	if f.cut.Load() {
		return nil
	}
	return f.ReadCloser.Close()
}

// Read returns released bytes, reading and scanning more while none are.
func (f *formBody) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		if f.buf == nil {
			f.buf = make([]byte, 32<<10)
		}
		n, err := f.ReadCloser.Read(f.buf)
		f.scan(f.buf[:n])
		if err != nil && f.err == nil {
			if errors.Is(err, io.EOF) && !f.refused(f.held) {
				f.release() // the body's end ends its last pair
			}
			if f.err == nil {
				f.err = err
			}
		}
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// scan sorts b into what goes on and what is held. A separator is "&" or ";" (methodParams).
func (f *formBody) scan(b []byte) {
	for len(b) > 0 && f.err == nil {
		if f.value {
			i := bytes.IndexAny(b, "&;")
			if i < 0 {
				f.out = append(f.out, b...)
				return
			}
			f.out, b, f.value = append(f.out, b[:i+1]...), b[i+1:], false
			continue
		}
		stops := "=&;"
		if f.name > 0 {
			stops = "&;" // a _method pair's value, "=" and all, up to its end
		}
		i := bytes.IndexAny(b, stops)
		end := i >= 0
		if !end {
			i = len(b) - 1
		}
		f.held, b = append(f.held, b[:i+1]...), b[i+1:]
		n := len(f.held) - f.name
		if end {
			n-- // the "=" or separator that ends it is no part of the name or value
		}
		if n > maxFormBytes {
			f.err, f.out, f.held = &formRefusal{overForm}, nil, nil
			f.cut.Store(true)
			return
		}
		if end {
			f.stop(f.held[len(f.held)-1])
		}
	}
}

// stop settles the held pair at its "=" or its separator, c, the held bytes' last.
func (f *formBody) stop(c byte) {
	pair := f.held[:len(f.held)-1]
	switch {
	case c != '=':
		if f.refused(pair) {
			return
		}
	case overrideName(string(pair)):
		f.name = len(f.held)
		return
	default:
		f.value = true
	}
	f.release()
}

// refused checks a pair at its end, before its last bytes go on, and reports whether it
// refused it.
func (f *formBody) refused(pair []byte) bool {
	v := refuseOverride(methodParams(string(pair)))
	if v != nil {
		f.err, f.out, f.held = &formRefusal{v}, nil, nil
		f.cut.Store(true)
	}
	return v != nil
}

// release lets the held pair go on.
func (f *formBody) release() {
	f.out = append(f.out, f.held...)
	f.held, f.name = f.held[:0], 0
}
