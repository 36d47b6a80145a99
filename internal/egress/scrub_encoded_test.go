package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
)

// echoEncoders are the ways real servers write back a string they were sent, written here
// without the scrubber's table: each is what a library does or a hand-made copy of it.
var echoEncoders = []struct {
	name string
	enc  func(string) string
}{
	{"Go encoding/json (<>& as \\u003c)", func(s string) string { b, _ := json.Marshal(s); return string(b) }},
	{"JSON.stringify (no HTML escapes)", jsonNoHTML},
	{"PHP json_encode (\\/ and \\u00e9)", func(s string) string { return jsonEscape(s, "/", false, "\\u%04x") }},
	{"Python json.dumps (ensure_ascii)", func(s string) string { return jsonEscape(s, "", false, "\\u%04x") }},
	{".NET System.Text.Json (\\u002B, upper-case hex)", func(s string) string { return jsonEscape(s, "", true, "\\u%04X") }},
	{"Go url.QueryEscape", url.QueryEscape},
	{"Go url.PathEscape", url.PathEscape},
	{"percent-encoding, lower-case hex (.NET HttpUtility)", func(s string) string {
		return regexp.MustCompile(`%[0-9A-F]{2}`).ReplaceAllStringFunc(url.QueryEscape(s), strings.ToLower)
	}},
	{"form encoding that keeps / (as Python's quote)", func(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "%2F", "/") }},
	{"Go html.EscapeString", html.EscapeString},
	{"HTML hex references (&#x2F;)", func(s string) string {
		var b strings.Builder
		for _, r := range s {
			if strings.ContainsRune("-._", r) || r < 0x80 && (r >= '0' && r <= '9' || r|0x20 >= 'a' && r|0x20 <= 'z') {
				b.WriteRune(r)
			} else {
				fmt.Fprintf(&b, "&#x%X;", r)
			}
		}
		return b.String()
	}},
	{"JSON of a query string (Location in a JSON error)", func(s string) string {
		b, _ := json.Marshal("https://api.example.com/login?next=" + url.QueryEscape(s))
		return string(b)
	}},
}

func jsonNoHTML(s string) string {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	_ = e.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// jsonEscape writes s as a JSON string: slash escaped as \/ if given, non-ASCII (and, for
// .NET, "&'+<> and `) as \u escapes in format f, pairs past the BMP.
func jsonEscape(s, slash string, dotnet bool, f string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' && !dotnet, r == '\\':
			b.WriteString(`\` + string(r))
		case slash != "" && string(r) == slash:
			b.WriteString(`\/`)
		case r > 0x7e || (dotnet && strings.ContainsRune("\"&'+<>`", r)):
			for _, u := range utf16.Encode([]rune{r}) {
				fmt.Fprintf(&b, f, u)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// encodedValues are values with the punctuation real secrets have: an AWS-style secret key
// ("/", "+", "="), and a password with what JSON, URLs and HTML escape, non-ASCII too.
var encodedValues = []string{
	"wJalr/XUtn+FEMI=K7MDbPx",
	`p<w>&"'\ é😀/0123456789ab`,
}

// TestScrubEncodedForms: a bound host that echoes a value re-encoded, as JSON encoders,
// percent-encoders and HTML escapers write it, hands the sandbox its placeholder encoded the
// same way, in a header field, the status line and a body however it is cut. Each form of
// the value went to the sandbox in clear: only the value as sent was looked for.
func TestScrubEncodedForms(t *testing.T) {
	for _, v := range encodedValues {
		ph, err := placeholderFor(v)
		if err != nil {
			t.Fatal(err)
		}
		swaps := []swap{{real: []byte(v), ph: []byte(ph)}}
		for _, e := range echoEncoders {
			body, want := "at "+e.enc(v)+".", "at "+e.enc(ph)+"."
			if e.enc(v) == v {
				continue // this encoder leaves this value as it is
			}
			t.Run(e.name+"/"+v[:5], func(t *testing.T) {
				resp := &http.Response{Status: "400 " + body, Header: http.Header{"X-Echo": {body}}, Body: http.NoBody}
				scrubResponse(resp, swaps)
				if resp.Status != "400 "+want || resp.Header.Get("X-Echo") != want {
					t.Fatalf("status %q, header field %q; want %q in each", resp.Status, resp.Header.Get("X-Echo"), want)
				}
				checkEveryCut(t, swaps, body, want)
			})
		}
	}
}

// TestScrubEncodedBasicCredentials: Basic credentials a host echoes re-encoded (PHP's JSON
// writes their base64's "/" as "\/") do not reach the sandbox. The sandbox's own credentials
// have their "/" elsewhere, or none, so its placeholder cannot be written in their place at
// the same length: the placeholder and "*" stand there, whatever the value's base64 holds.
func TestScrubEncodedBasicCredentials(t *testing.T) {
	real, ph := "dXNlcjpyZWFs/3+ZZZ/aGVsbG8=", "dXNlcjpwaGFiYmJiYmJiYmJi9Q="
	swaps := []swap{{real: []byte(real), ph: []byte(ph)}}
	for _, e := range echoEncoders {
		if e.enc(real) == real {
			continue
		}
		t.Run(e.name, func(t *testing.T) {
			enc := e.enc(real)
			resp := &http.Response{Header: http.Header{"X-Echo": {"<" + enc + ">"}}, Body: http.NoBody}
			scrubResponse(resp, swaps)
			got := resp.Header.Get("X-Echo")
			if strings.Contains(got, enc) || strings.Contains(got, "ZZZ") || len(got) != len(enc)+2 || got[0] != '<' || got[len(got)-1] != '>' {
				t.Fatalf("%q became %q", enc, got)
			}
		})
	}
}

// encodedSecret is an AWS-style secret key with a password's punctuation after it.
const encodedSecret = `wJalrXUtnFEMI/K7MDENG+bPxRfiCY=q<p&w>"'`

// echoEncodedHandler is a bound host that hands X-Echo back re-encoded: in the body (one
// line per echoEncoders row, cut into two writes at ?cut), in header fields (PHP's JSON, a
// Location's query, HTML references) and in trailers (.NET's JSON, lower-case percent).
func echoEncodedHandler(got chan<- string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, cut := echoRequest(r, got)
		body := encodedEcho(v)
		w.Header().Set("Trailer", "X-Trailer-Json, X-Trailer-Query")
		for k, e := range echoHeaderFields {
			w.Header().Set(k, echoEncoders[e].enc(v))
		}
		w.WriteHeader(http.StatusBadRequest)
		writeCut(w, body, cut)
		for k, e := range echoTrailers {
			w.Header().Set(k, echoEncoders[e].enc(v))
		}
	}
}

// echoRequest is what an echo handler takes from its request: the X-Echo field, sent on got
// when it has room, and the point ?cut to cut the body at.
func echoRequest(r *http.Request, got chan<- string) (v string, cut int) {
	v = r.Header.Get("X-Echo")
	select {
	case got <- v:
	default:
	}
	cut, _ = strconv.Atoi(r.URL.Query().Get("cut"))
	return v, cut
}

// writeCut writes body in two writes cut at cut, flushed between, as an upstream's reads may
// cut it.
func writeCut(w http.ResponseWriter, body string, cut int) {
	_, _ = io.WriteString(w, body[:min(cut, len(body))])
	w.(http.Flusher).Flush()
	_, _ = io.WriteString(w, body[min(cut, len(body)):])
}

// echoHeaderFields and echoTrailers name the echoEncoders row each field holds.
var (
	echoHeaderFields = map[string]int{"X-Echo-Json": 2, "Location": 5, "X-Echo-Html": 10}
	echoTrailers     = map[string]int{"X-Trailer-Json": 4, "X-Trailer-Query": 7}
)

func encodedEcho(v string) string {
	var b strings.Builder
	for _, e := range echoEncoders {
		b.WriteString(e.enc(v) + "\n")
	}
	return b.String()
}

// TestEncodedEchoReachesTheSandboxAsItsPlaceholder: through the proxy, a bound host echoing
// a secret re-encoded (JSON escapes, percent-encoding, HTML references) in its body, header
// fields and trailers hands the sandbox its placeholder encoded the same way, the body cut
// into two writes at every point; and no form of the value is in anything the sandbox got,
// the decisions, the summary, the log or the metrics. The value went back in clear in every
// form but Go's and JavaScript's JSON, which leave its punctuation as it is.
func TestEncodedEchoReachesTheSandboxAsItsPlaceholder(t *testing.T) {
	got := make(chan string, 1)
	h, ph, client := echoThroughProxy(t, echoEncodedHandler(got))
	var seen strings.Builder
	want := encodedEcho(ph)
	for cut := 0; cut <= len(encodedEcho(encodedSecret)); cut++ {
		seen.WriteString(getEncodedEcho(t, client, ph, cut, want))
	}
	if v := <-got; v != encodedSecret {
		t.Fatalf("the bound host got %d bytes, not the value: the test would prove nothing", len(v))
	}
	checkNoSinkHolds(t, h, seen.String(), map[string]string{}, false)
}

// echoThroughProxy starts the bound host api.example.com serving handler, encodedSecret bound
// to it, and returns the proxy's harness, the placeholder the sandbox holds and a client of the
// sandbox's that keeps one tunnel for all its requests.
func echoThroughProxy(t *testing.T, handler http.Handler) (*harness, string, *http.Client) {
	t.Helper()
	caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
	srv := httptest.NewUnstartedServer(handler)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	policy := testPolicy()
	policy.Secrets = append(policy.Secrets, Secret{Env: "AWS_SECRET_ACCESS_KEY", Value: encodedSecret, Hosts: []string{"api.example.com"}})
	h := setupPolicy(t, func(c *Config) {
		c.Dialer.(*stubDialer).routes[apiAddr+":443"] = srv.Listener.Addr().String()
		c.UpstreamCAPEM = caPEM
	}, policy)
	tr := h.client(t).Transport.(*http.Transport).Clone()
	tr.DisableKeepAlives = false
	t.Cleanup(tr.CloseIdleConnections)
	return h, h.placeholderOf(t, "AWS_SECRET_ACCESS_KEY"), &http.Client{Transport: tr}
}

// checkNoSinkHolds fails t when what the sandbox read (seen), the proxy's decisions, summary,
// log or metrics hold encodedSecret as it is, in any of echoEncoders' forms or in forms; in
// base64 too when decoded.
func checkNoSinkHolds(t *testing.T, h *harness, seen string, forms map[string]string, decoded bool) {
	t.Helper()
	decisions, _ := json.Marshal(h.all())
	summary, _ := json.Marshal(h.proxy.Summary())
	sinks := map[string]string{"sandbox": seen, "decisions": string(decisions), "summary": string(summary),
		"logs": h.logs.String(), "metrics": gatherText(t, h)}
	forms["as it is"] = encodedSecret
	for _, e := range echoEncoders {
		forms[e.name] = strings.Trim(e.enc(encodedSecret), `"`)
	}
	for name, out := range sinks {
		for how, f := range forms {
			if strings.Contains(out, f) {
				t.Errorf("the %s holds the value, written %s", name, how)
			}
		}
		if decoded && decodedHolds(out, encodedSecret) {
			t.Errorf("the %s holds the value in base64", name)
		}
	}
}

// getEncodedEcho asks the host of TestEncodedEchoReachesTheSandboxAsItsPlaceholder for its
// echo of ph cut at cut, checks the answer is want's in every part, and returns it whole.
func getEncodedEcho(t *testing.T, client *http.Client, ph string, cut int, want string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://api.example.com/echo?cut="+strconv.Itoa(cut), nil)
	req.Header.Set("X-Echo", ph)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("cut %d: %v", cut, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("cut %d: %v", cut, err)
	}
	var all strings.Builder
	_ = resp.Header.Write(&all)
	all.Write(body)
	_ = resp.Trailer.Write(&all)
	if string(body) != want {
		lines, wants := strings.Split(string(body), "\n"), strings.Split(want, "\n")
		for i := range min(len(lines), len(echoEncoders)) {
			if lines[i] != wants[i] {
				t.Fatalf("cut %d: the body's line written as %s is not the placeholder's", cut, echoEncoders[i].name)
			}
		}
		t.Fatalf("cut %d: the sandbox read %d bytes, want %d", cut, len(body), len(want))
	}
	for k, e := range echoHeaderFields {
		if g, w := resp.Header.Get(k), echoEncoders[e].enc(ph); g != w {
			t.Fatalf("cut %d: header field %s is not the placeholder's %q", cut, k, w)
		}
	}
	for k, e := range echoTrailers {
		if g, w := resp.Trailer.Get(k), echoEncoders[e].enc(ph); g != w {
			t.Fatalf("cut %d: trailer %s is not the placeholder's %q", cut, k, w)
		}
	}
	return all.String()
}

// TestScrubDropsFieldsNamedByAnEncodedValue: "%" is a character of a field's name, so an echo
// that makes a field of what it got, percent-encoded, names it by the value's "/" as "%2F":
// dropped like a name that holds the value as it is, in any letters' case.
func TestScrubDropsFieldsNamedByAnEncodedValue(t *testing.T) {
	swaps := []swap{{real: []byte("tok/abcdef0123456789"), ph: []byte("qrs/zyxwvu9876543210")}}
	resp := &http.Response{
		Header: http.Header{"X-Tok%2fabcdef0123456789": {"1"}, "X-Echo": {"1"}},
		Body:   http.NoBody, Trailer: http.Header{},
	}
	resp.Header["Tok%2FABCDEF0123456789-Seen"] = []string{"1"} // as a server wrote it
	scrubResponse(resp, swaps)
	if len(resp.Header) != 1 || resp.Header.Get("X-Echo") != "1" {
		t.Fatalf("header %d fields, want X-Echo alone", len(resp.Header))
	}
}
