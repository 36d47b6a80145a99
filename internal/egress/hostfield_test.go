package egress

import (
	"bufio"
	"io"
	"net/http"
	"testing"
)

// TestUpstreamGetsTheHostDecided: the Host an upstream reads is the host and port the policy
// decided on, as the proxy normalised them, never as the sandbox spelled them. A server or a
// front end that routes by the Host string ("API.Example.COM." is no vhost of its, nor is
// "api.example.com:443" to one matching the bare name) could hand the request, a swapped
// secret with it, to another site than the one allowed.
func TestUpstreamGetsTheHostDecided(t *testing.T) {
	tests := []struct {
		name       string
		terminated bool
		request    string
	}{
		{"terminated: Host in upper case with a trailing dot", true, "GET /v1 HTTP/1.1\r\nHost: API.Example.COM.\r\n\r\n"},
		{"terminated: Host with the default port", true, "GET /v1 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n"},
		{"terminated: absolute-form target spelled otherwise", true, "GET https://Api.Example.com.:443/v1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n"},
		{"terminated: HTTP/1.0 without a Host", true, "GET /v1 HTTP/1.0\r\n\r\n"},
		{"forwarded: target in upper case with a trailing dot", false, "GET http://PLAIN.example.com./x HTTP/1.1\r\nHost: plain.example.com\r\n\r\n"},
		{"forwarded: target with the default port", false, "GET http://plain.example.com:80/x HTTP/1.1\r\nHost: Plain.Example.com.:80\r\n\r\n"},
		{"forwarded: HTTP/1.0 without a Host", false, "GET http://plain.Example.com/x HTTP/1.0\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, nil)
			up, want := h.plainUp, "plain.example.com"
			var rw io.ReadWriter = h.dialProxy(t)
			if tt.terminated {
				tc, _ := h.terminated(t, "api.example.com:443")
				up, want, rw = h.tlsUp, "api.example.com", tc
			}
			sendOK(t, rw, tt.request)
			if got := up.last(t).Host; got != want {
				t.Errorf("the upstream read Host %q, want %q: what the policy decided on", got, want)
			}
		})
	}
}

// sendOK writes the raw request req on rw, a connection to the proxy or a tunnel through it,
// and wants the proxy's answer, 200.
func sendOK(t *testing.T, rw io.ReadWriter, req string) {
	t.Helper()
	if _, err := io.WriteString(rw, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(rw), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", resp.StatusCode, resp.Header.Get("X-Boxcar-Egress"))
	}
}
