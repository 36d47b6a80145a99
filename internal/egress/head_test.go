package egress

import (
	"bufio"
	"fmt"
	"net"
	"testing"
	"time"
)

// TestReadHeadFindsTheEndHoweverItArrives: the header's end is found whether the request comes
// whole, a byte at a time (each search starting where the last one stopped) or with its
// "\r\n\r\n" split across writes, and the header stops at the first end, not in the body.
func TestReadHeadFindsTheEndHoweverItArrives(t *testing.T) {
	const req = "POST http://plain.example.com/up HTTP/1.1\r\nHost: plain.example.com\r\nContent-Length: 8\r\n\r\nbody\r\n\r\n"
	tests := []struct {
		name   string
		chunks func() []string
	}{
		{"whole", func() []string { return []string{req} }},
		{"a byte at a time", func() []string {
			var out []string
			for i := range len(req) {
				out = append(out, req[i:i+1])
			}
			return out
		}},
		{"the end split after its first two bytes", func() []string {
			i := len("POST http://plain.example.com/up HTTP/1.1\r\nHost: plain.example.com\r\nContent-Length: 8\r\n")
			return []string{req[:i], req[i : i+2], req[i+2:]}
		}},
		{"the end split after its first three bytes", func() []string {
			i := len("POST http://plain.example.com/up HTTP/1.1\r\nHost: plain.example.com\r\nContent-Length: 8\r\n\r")
			return []string{req[:i], req[i : i+2], req[i+2:]}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			defer server.Close()
			go func() {
				for _, c := range tt.chunks() {
					if _, err := client.Write([]byte(c)); err != nil {
						return
					}
				}
			}()
			p := &Proxy{cfg: Config{Limits: Limits{HeaderTimeout: time.Minute, MaxHeaderBytes: 32 << 10}}}
			ic := &idleConn{Conn: server, idle: time.Minute}
			hd, reason, detail, err := p.readHead(ic, bufio.NewReaderSize(ic, 32<<10+1), time.Now())
			if err != nil || reason != "" {
				t.Fatalf("readHead: %v %s %s", err, reason, detail)
			}
			if hd.method != "POST" || hd.host != "plain.example.com" || hd.fields["content-length"][0] != "8" {
				t.Errorf("head = %+v, want the POST to plain.example.com with its Content-Length", hd)
			}
		})
	}
}

// TestFramingFieldInAnySpelling: a server that folds names (foldFieldName: lighttpd's CGI,
// FastCGI and SCGI write "_" for every character but a letter or digit, gunicorn before 22
// reads "_" as "-") frames by a Content.Length or Transfer+Encoding the proxy took for any
// other field and sent on: the smuggling table refused the "_" spelling alone. Every spelling
// that folds to a framing field is refused, beside the real field or alone.
func TestFramingFieldInAnySpelling(t *testing.T) {
	var rows []string
	for _, sep := range "_.+~!#$%&'*^`|" {
		for _, f := range []string{"Content%cLength: 50", "transfer%cencoding: chunked", "CONTENT%cLENGTH: 5"} {
			rows = append(rows, "Content-Length: 5\r\n"+fmt.Sprintf(f, sep), fmt.Sprintf(f, sep))
		}
	}
	for _, fields := range rows {
		t.Run(fields, func(t *testing.T) {
			raw := "POST http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n" + fields + "\r\n\r\n"
			if _, reason, detail, _ := parseHead([]byte(raw)); reason != ReasonSmuggling {
				t.Errorf("parseHead: %q (%s), want %s", reason, detail, ReasonSmuggling)
			}
		})
	}
	for _, fields := range []string{"Content-Length: 5", "X-Content.Length: 5", "Transfer-Encoding: chunked", "Content.Type: text/plain"} {
		raw := "POST http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n" + fields + "\r\n\r\n"
		if _, reason, detail, _ := parseHead([]byte(raw)); reason != "" {
			t.Errorf("%q: parseHead refused it: %s (%s)", fields, reason, detail)
		}
	}
}
