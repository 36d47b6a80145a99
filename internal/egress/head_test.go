package egress

import (
	"bufio"
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
