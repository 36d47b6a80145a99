package egress

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// get makes a GET through the proxy with the placeholder as a bearer token.
func get(t *testing.T, h *harness, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := h.client(t).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestRoundTrips(t *testing.T) {
	tests := []struct {
		name       string
		url        string
		up         func(*harness) *upstream
		wantAuth   func(placeholder string) string // what the upstream must see
		wantReason Reason
		wantAddr   string
	}{
		{"https to the bound host: placeholder swapped", "https://api.example.com/v1", tlsUp,
			func(string) string { return "Bearer " + realToken }, ReasonIntercepted, apiAddr + ":443"},
		{"https to an unbound host: placeholder unchanged", "https://pkg.example.com/simple/", tlsUp,
			func(ph string) string { return "Bearer " + ph }, ReasonAllowed, pkgAddr + ":443"},
		{"https to a wildcard name: placeholder unchanged", "https://a.files.example.com/f", tlsUp,
			func(ph string) string { return "Bearer " + ph }, ReasonAllowed, filesAddr + ":443"},
		{"plain http to the bound host: not swapped", "http://api.example.com/v1", plainUp,
			func(ph string) string { return "Bearer " + ph }, ReasonAllowed, apiAddr + ":80"},
		{"plain http to an unbound host: unchanged", "http://plain.example.com/x", plainUp,
			func(ph string) string { return "Bearer " + ph }, ReasonAllowed, plainAddr + ":80"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, nil)
			ph := h.placeholder(t)
			status, body := get(t, h, tt.url, ph)
			if status != http.StatusOK || !strings.HasPrefix(body, "hello from") {
				t.Fatalf("status %d, body %q", status, body)
			}
			if got := tt.up(h).last(t).Header.Get("Authorization"); got != tt.wantAuth(ph) {
				t.Errorf("upstream saw Authorization %q, want %q", redact(got), redact(tt.wantAuth(ph)))
			}
			d := h.waitDecision(t, "the request's", func(d Decision) bool {
				return d.Addr == tt.wantAddr && (d.Method != http.MethodConnect || d.Reason == ReasonAllowed)
			})
			if !d.Allowed || d.Reason != tt.wantReason || d.Host == "" || d.BytesIn == 0 {
				t.Errorf("decision %+v, want allowed, %s, a host and bytes in", d, tt.wantReason)
			}
			if got := h.dialer.seen(); !slices.Equal(got, []string{tt.wantAddr}) {
				t.Errorf("dialled %v, want only %s", got, tt.wantAddr)
			}
		})
	}
}

func tlsUp(h *harness) *upstream   { return h.tlsUp }
func plainUp(h *harness) *upstream { return h.plainUp }

// redact keeps test failures from printing the real value.
func redact(s string) string { return strings.ReplaceAll(s, realToken, "<REAL>") }
