package egress

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strings"
	"time"
)

// head is what the proxy reads from a request's raw header before net/http parses it: the
// fields net/http would hide (it folds Host into the URL and drops Content-Length when
// Transfer-Encoding is set) and the shapes request smuggling needs.
type head struct {
	method, target, version string
	host                    string // the Host field, "" when absent
	fields                  map[string][]string
}

// headRule is one row of the smuggling table: a shape the proxy refuses, because the proxy and
// the upstream could frame the request differently.
type headRule struct {
	what  string
	match func(h *head) bool
}

var headRules = []headRule{
	{"Content-Length together with Transfer-Encoding", func(h *head) bool {
		return len(h.fields["content-length"]) > 0 && len(h.fields["transfer-encoding"]) > 0
	}},
	{"more than one Content-Length", func(h *head) bool { return len(h.fields["content-length"]) > 1 }},
	{"more than one Transfer-Encoding", func(h *head) bool { return len(h.fields["transfer-encoding"]) > 1 }},
	{"more than one Host", func(h *head) bool { return len(h.fields["host"]) > 1 }},
	{"Content-Length not a plain number", func(h *head) bool {
		cl := h.fields["content-length"]
		return len(cl) == 1 && (cl[0] == "" || strings.Trim(cl[0], "0123456789") != "" || len(cl[0]) > 18)
	}},
	{"Transfer-Encoding other than chunked", func(h *head) bool {
		te := h.fields["transfer-encoding"]
		return len(te) == 1 && !strings.EqualFold(te[0], "chunked")
	}},
	{"Transfer-Encoding on HTTP/1.0", func(h *head) bool {
		return h.version == "HTTP/1.0" && len(h.fields["transfer-encoding"]) > 0
	}},
	// Servers that fold names (foldFieldName: CGI's HTTP_ variables, gunicorn before 22,
	// lighttpd's CGI, FastCGI and SCGI, which write "_" for every character but a letter or
	// digit) frame by a field the proxy takes for any other and sends on: Content.Length,
	// Transfer+Encoding, Content_Length.
	{"a framing field's name with another character for \"-\" (Content_Length, Transfer.Encoding)", func(h *head) bool {
		for k := range h.fields {
			if f := foldFieldName(k); f != k && (f == "content-length" || f == "transfer-encoding") {
				return true
			}
		}
		return false
	}},
}

// readHead waits, up to Limits.HeaderTimeout from start, for a whole request header in br
// (leaving it there for http.ReadRequest) and checks its shape. A clean EOF before any byte
// returns errClientDone; a refusal returns its reason and detail.
func (p *Proxy) readHead(c *idleConn, br *bufio.Reader, start time.Time) (*head, Reason, string, error) {
	c.hard = start.Add(p.cfg.Limits.HeaderTimeout)
	defer func() { c.hard = time.Time{} }()
	limit := p.cfg.Limits.MaxHeaderBytes
	n, from := 1, 0
	for {
		buf, err := br.Peek(n)
		if i := bytes.Index(buf[from:], []byte("\r\n\r\n")); i >= 0 {
			return parseHead(buf[:from+i+4])
		}
		// The next search starts where this one could not have found the end (three bytes
		// back, for an end split across reads): searched from the start each time, a client
		// sending its header a byte at a time cost the worker time quadratic in its size.
		from = max(len(buf)-3, 0)
		switch {
		case len(buf) > limit:
			return nil, ReasonHeaderTooLarge, "request header over the limit", nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, ReasonHeaderTimeout, "request header not complete in time", nil
		case err != nil && len(buf) == 0:
			return nil, "", "", errClientDone
		case err != nil:
			return nil, ReasonBadRequest, "connection ended inside the request header", errClientDone
		}
		// Search what is buffered already before waiting for one more byte.
		if b := br.Buffered(); b > len(buf) {
			n = b
		} else {
			n = len(buf) + 1
		}
	}
}

var errClientDone = errors.New("egress: client closed the connection")

// parseHead splits the raw header into the request line and fields and runs the table.
func parseHead(raw []byte) (*head, Reason, string, error) {
	if bytes.ContainsAny(bytes.ReplaceAll(raw, []byte("\r\n"), nil), "\r\n") {
		return nil, ReasonSmuggling, "bare CR or LF in the header", nil
	}
	lines := strings.Split(string(raw[:len(raw)-4]), "\r\n")
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
		return nil, ReasonBadRequest, "request line is not METHOD SP target SP HTTP/1.x", nil
	}
	h := &head{method: parts[0], target: parts[1], version: parts[2], fields: map[string][]string{}}
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if !ok || !isToken(name) {
			return nil, ReasonSmuggling, "a header line that is not name: value (or is folded)", nil
		}
		if strings.ContainsFunc(value, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
			return nil, ReasonSmuggling, "control character in a header value", nil
		}
		key := strings.ToLower(name)
		h.fields[key] = append(h.fields[key], strings.Trim(value, " \t"))
	}
	if hv := h.fields["host"]; len(hv) > 0 {
		h.host = hv[0]
	}
	for _, r := range headRules {
		if r.match(h) {
			return nil, ReasonSmuggling, r.what, nil
		}
	}
	return h, "", "", nil
}

// isToken reports whether s is an RFC 9110 token (a field name: no spaces, no separators).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}
