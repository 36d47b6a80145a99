package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// TestUpstreamGetsNoForwardingFields: the fields a front end reads as what a proxy before it
// saw (the client's address, the host, scheme and path it asked for) never reach an upstream
// from the sandbox, in any spelling, on the forwarded and terminated paths alike. A front end
// that routes or authorises by them (X-Forwarded-Host to pick a site, X-Forwarded-For or
// X-Real-IP to trust an internal client, X-Original-URL to rewrite the path) took the
// sandbox's word for another site or another client, with the swapped-in secret on a bound
// host. Nor do they go as trailers, which the forwarded path sent on. A placeholder in a field
// the proxy drops reached nothing, and the decision does not name its secret as used.
func TestUpstreamGetsNoForwardingFields(t *testing.T) {
	fields := []string{
		"X-Forwarded-For: 10.0.0.1", "X-Forwarded-Host: admin.example.com", "X-Forwarded-Proto: https",
		"X-Forwarded-Port: 443", "X-Forwarded-Prefix: /admin", "X-Forwarded-Server: admin.example.com",
		"Forwarded: for=10.0.0.1;host=admin.example.com;proto=https", "X-Real-IP: 10.0.0.1",
		"True-Client-IP: 10.0.0.1", "X-Client-IP: 10.0.0.1", "X-Cluster-Client-IP: 10.0.0.1",
		"CF-Connecting-IP: 10.0.0.1", "Fastly-Client-IP: 10.0.0.1", "X-Originating-IP: 10.0.0.1",
		"X-Host: admin.example.com", "X-Original-Host: admin.example.com", "X-Original-URL: /admin",
		"X-Rewrite-URL: /admin", "X-HTTP-Host-Override: admin.example.com",
		"X_Forwarded_For: 10.0.0.1", "x-forwarded.host: admin.example.com", "X-Forwarded-User: admin",
		"X-Envoy-Original-Dst-Host: 10.0.0.1:8080", "X-Envoy-Max-Retries: 5", "X-Envoy-Internal: true",
		// lighttpd's CGI, FastCGI and SCGI name every character but a letter or digit "_": PHP
		// behind it reads each of these as HTTP_X_REAL_IP, HTTP_X_FORWARDED_HOST ...
		"X~Real~IP: 10.0.0.1", "X*Forwarded*Host: admin.example.com", "True+Client+IP: 10.0.0.1",
		"X!Original!URL: /admin", "X^Envoy^Max^Retries: 5",
	}
	sent := map[string]bool{"x-forwarded-email": true}
	for _, f := range fields {
		name, _, _ := strings.Cut(f, ":")
		sent[foldFieldName(name)] = true
	}
	tests := []struct {
		name       string
		terminated bool
		target     string
	}{
		{"terminated, bound host", true, "/v1"},
		{"forwarded, bound host over http://", false, "http://api.example.com/v1"},
		{"forwarded, host without a secret", false, "http://plain.example.com/v1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, nil)
			ph := h.placeholder(t)
			var rw io.ReadWriter = h.dialProxy(t)
			if tt.terminated {
				rw, _ = h.terminated(t, "api.example.com:443")
			}
			// The fields again as trailers: a server that merges trailers into the header
			// (Apache's MergeTrailers, the default before 2.4.11) reads them there.
			req := "POST " + tt.target + " HTTP/1.1\r\nHost: " + hostOf(tt.target) + "\r\n" +
				strings.Join(fields, "\r\n") + "\r\nX-Forwarded-Email: " + ph + "\r\nX-Job-Field: kept\r\n" +
				"Transfer-Encoding: chunked\r\nTrailer: X-Forwarded-For, X-Real-IP\r\n\r\n3\r\nabc\r\n0\r\n" +
				strings.Join(fields, "\r\n") + "\r\n\r\n"
			sendOK(t, rw, req)
			up := h.plainUp
			if tt.terminated {
				up = h.tlsUp
			}
			if tr := up.last(t).Trailer; len(tr) != 0 {
				t.Errorf("the upstream got the sandbox's trailers %q", tr)
			}
			got := up.last(t).Header
			for name := range got {
				if sent[foldFieldName(name)] {
					t.Errorf("the upstream got %s: %q", name, got[name])
				}
			}
			if got.Get("X-Job-Field") != "kept" {
				t.Errorf("the upstream got X-Job-Field %q, want the sandbox's field passed on", got.Get("X-Job-Field"))
			}
			d := h.waitDecision(t, "the request", withMethod(http.MethodPost))
			if len(d.Secrets) != 0 {
				t.Errorf("decision names secrets %v used, where their placeholder was only in a dropped field", d.Secrets)
			}
		})
	}
}

// TestSecretsUsedAreTheOnesSent: a placeholder in a field the proxy does not send on (a
// hop-by-hop field, one Connection names, a second User-Agent, an Accept-Encoding the proxy
// puts its own in place of) is no use of its secret: the
// decision, and so the job's manifest, named the secret as used for a value that never left
// the proxy.
func TestSecretsUsedAreTheOnesSent(t *testing.T) {
	for _, field := range []string{"Proxy-Authorization: Bearer %s", "Connection: X-Api-Key\r\nX-Api-Key: %s", "Keep-Alive: %s",
		"User-Agent: curl/8\r\nUser-Agent: %s",         // net/http writes the first User-Agent alone
		"Accept-Encoding: %s", "Accept_Encoding: %s"} { // the proxy asks for identity
		t.Run(strings.SplitN(field, ":", 2)[0], func(t *testing.T) {
			h := setup(t, nil)
			tc, br := h.terminated(t, "api.example.com:443")
			req := "GET /v1 HTTP/1.1\r\nHost: api.example.com\r\n" + strings.ReplaceAll(field, "%s", h.placeholder(t)) + "\r\n\r\n"
			if _, err := io.WriteString(tc, req); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			resp.Body.Close()
			if n := len(h.tlsUp.last(t).Header.Values("X-Api-Key")); n != 0 {
				t.Errorf("the upstream got X-Api-Key, which Connection named")
			}
			d := h.waitDecision(t, "the request", withMethod(http.MethodGet))
			if slices.Contains(d.Secrets, "EXAMPLE_TOKEN") {
				t.Errorf("decision names EXAMPLE_TOKEN used; its placeholder was only in a field not sent on")
			}
		})
	}
}

// hostOf is a request target's host for its Host field: the bound host inside a tunnel.
func hostOf(target string) string {
	rest, ok := strings.CutPrefix(target, "http://")
	if !ok {
		return "api.example.com"
	}
	h, _, _ := strings.Cut(rest, "/")
	return h
}

// TestMethodOverrideToAForwardedMethodGoesOn: the proxy refuses an override that names a
// method it does not forward (TestBypass's override rows), and passes every other on as the
// sandbox sent it, on both paths: a client that sends a PATCH as a POST means a PATCH.
func TestMethodOverrideToAForwardedMethodGoesOn(t *testing.T) {
	for _, tt := range []struct {
		url string
		up  func(*harness) *upstream
	}{
		{"https://api.example.com/v1?_method=PATCH", func(h *harness) *upstream { return h.tlsUp }},
		{"http://plain.example.com/v1?_method=PATCH", func(h *harness) *upstream { return h.plainUp }},
	} {
		t.Run(tt.url, func(t *testing.T) {
			h := setup(t, nil)
			req, _ := http.NewRequest(http.MethodPost, tt.url, strings.NewReader("{}"))
			req.Header.Set("X-HTTP-Method-Override", "PATCH")
			resp, err := h.client(t).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := tt.up(h).last(t)
			if resp.StatusCode != http.StatusOK || got.Header.Get("X-HTTP-Method-Override") != "PATCH" || got.URL.Query().Get("_method") != "PATCH" {
				t.Errorf("status %d, the upstream got %q and ?%s: want the PATCH override as sent", resp.StatusCode, got.Header.Get("X-HTTP-Method-Override"), got.URL.RawQuery)
			}
		})
	}
}

// TestFormMethodOverrideGoesOn: a form the proxy reads for its _method (the refusals are
// TestBypass's form rows) goes upstream byte for byte, its length, chunked or not, and a
// 100-continue the sandbox waits for answered, on both paths, at any size: an AWS Query call
// (SQS SendMessage, SNS Publish: 256 KiB; SES SendRawEmail: 10 MB) over the 64 KiB the proxy
// read was refused (the 300 KiB rows: 405 on both paths).
func TestFormMethodOverrideGoesOn(t *testing.T) {
	large := largeForm(300 << 10)
	for _, url := range []string{"https://api.example.com/body", "http://plain.example.com/body"} {
		for _, tt := range []struct {
			name, body string
			chunked    bool
			expect     bool
		}{
			{"PATCH", "_method=PATCH&a=1", false, false},
			{"chunked", "_method=PATCH&a=1", true, false},
			{"100-continue", "_method=PATCH&a=1", false, true},
			{"300 KiB", large, false, false},
			{"300 KiB, chunked", large, true, false},
			{"300 KiB, 100-continue", large, false, true},
			{"multipart", multipartForm, false, false},
			{"multipart, chunked", multipartForm, true, false},
		} {
			t.Run(url+" "+tt.name, func(t *testing.T) {
				h := setup(t, nil)
				client := h.client(t)
				if tt.expect {
					client.Transport.(*http.Transport).ExpectContinueTimeout = time.Minute
				}
				var body io.Reader = strings.NewReader(tt.body)
				if tt.chunked {
					body = io.MultiReader(body) // no length: sent chunked
				}
				req, _ := http.NewRequest(http.MethodPost, url, body)
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				if tt.body == multipartForm {
					req.Header.Set("Content-Type", "multipart/form-data; boundary=b")
				}
				if tt.expect {
					req.Header.Set("Expect", "100-continue")
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(got) != tt.body {
					t.Errorf("status %d %s, the upstream got %d bytes %.80q: want the form's %d as sent",
						resp.StatusCode, resp.Header.Get("X-Boxcar-Egress"), len(got), got, len(tt.body))
				}
			})
		}
	}
}

// multipartForm is an upload of 300 KiB with a _method asking for PATCH after it, names
// ("filename=", "name=" in the file's bytes) and "--" lines that name no _method part.
var multipartForm = "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"name=_method\"\r\n\r\n" +
	strings.Repeat("name=\"_method\"\r\n\r\nPATCH\r\n--x\r\n", 300<<10/26) + "\r\n--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPATCH\r\n--b--\r\n"

// largeForm is an AWS Query call of about n bytes: names and values with escapes, "=" and
// ";" in values, a _method asking for PATCH, and a long message.
func largeForm(n int) string {
	var b strings.Builder
	b.WriteString("Action=SendMessage&Version=2012-11-05&_method=PATCH&QueueUrl=https%3A%2F%2Fsqs.example.com%2F1%2Fq")
	for i := 0; b.Len() < n/2; i++ {
		fmt.Fprintf(&b, "&MessageAttribute.%d.Name=a%%3Db;c&MessageAttribute.%d.Value.StringValue=%s", i, i, strings.Repeat("v+w", i%50))
	}
	b.WriteString("&MessageBody=")
	b.WriteString(strings.Repeat("x%26y%3D", (n-b.Len())/8+1))
	return b.String()
}

// TestFormOverrideLateIsCut: a _method=TRACE after 200 KiB of other parameters, read as the
// form goes upstream, is refused, and the upstream's request is cut before its body's end:
// the server got no whole request to act on.
func TestFormOverrideLateIsCut(t *testing.T) {
	body := largeForm(200<<10) + "&_method=TRACE"
	for _, tt := range []struct {
		url     string
		up      func(h *harness) *upstream
		chunked bool
	}{
		{"https://api.example.com/", func(h *harness) *upstream { return h.tlsUp }, false},
		{"https://api.example.com/", func(h *harness) *upstream { return h.tlsUp }, true},
		{"http://plain.example.com/", func(h *harness) *upstream { return h.plainUp }, false},
		{"http://plain.example.com/", func(h *harness) *upstream { return h.plainUp }, true},
	} {
		t.Run(fmt.Sprintf("%s chunked=%v", tt.url, tt.chunked), func(t *testing.T) {
			h := setup(t, nil)
			var r io.Reader = strings.NewReader(body)
			if tt.chunked {
				r = io.MultiReader(r)
			}
			req, _ := http.NewRequest(http.MethodPost, tt.url, r)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if resp, err := h.client(t).Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusMethodNotAllowed {
					t.Errorf("status %d, want 405", resp.StatusCode)
				}
			}
			d := h.waitDecision(t, "the refusal", func(d Decision) bool { return !d.Allowed })
			if d.Reason != ReasonMethod || d.BytesOut == 0 {
				t.Errorf("decision %+v, want method, with the bytes sent before the cut", d)
			}
			up := tt.up(h)
			testharness.Wait(t, "the upstream to read the body's cut", func() (bool, error) {
				return up.cutCount() == 1, nil
			}, testharness.Within(30*time.Second))
			if n := up.count(); n != 0 {
				t.Errorf("the upstream got %d whole requests, want none", n)
			}
		})
	}
}

// TestUnsentRequestNamesNoSecret: a request inside a terminated tunnel that never reached
// its host (the dial failed, the host's TLS did not verify) sent no value upstream, and its
// decision named the secret swapped into its header all the same, in the transcript.
func TestUnsentRequestNamesNoSecret(t *testing.T) {
	for _, tt := range []struct {
		name  string
		route func(h *harness) // where api.example.com:443 leads
		want  Reason
	}{
		{"dial failed", func(h *harness) { delete(h.dialer.routes, apiAddr+":443") }, ReasonDial},
		{"upstream TLS failed", func(h *harness) { h.dialer.routes[apiAddr+":443"] = h.dialer.routes[apiAddr+":80"] }, ReasonUpstreamTLS},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, nil)
			h.dialer.mu.Lock()
			tt.route(h)
			h.dialer.mu.Unlock()
			tc, br := h.terminated(t, "api.example.com:443")
			if _, err := io.WriteString(tc, "GET /v1 HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer "+h.placeholder(t)+"\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			resp.Body.Close()
			d := h.waitDecision(t, "the request", withMethod(http.MethodGet))
			if d.Reason != tt.want || len(d.Secrets) != 0 || len(h.proxy.Summary().Secrets) != 0 {
				t.Errorf("decision %s %v, summary %v: want %s naming no secret", d.Reason, d.Secrets, h.proxy.Summary().Secrets, tt.want)
			}
		})
	}
}

// TestFormOverrideCutOnAPooledConnection: a form refused as it goes upstream on a kept-alive
// connection of the terminated tunnels' pool ends that connection: the server got no whole
// request of it, and the next request, on a new connection, is framed and read as it was sent.
func TestFormOverrideCutOnAPooledConnection(t *testing.T) {
	h := setup(t, nil)
	post := func(body string, chunked bool) (int, string) {
		t.Helper()
		var r io.Reader = strings.NewReader(body)
		if chunked {
			r = io.MultiReader(r)
		}
		req, _ := http.NewRequest(http.MethodPost, "https://api.example.com/body", r)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := h.client(t).Do(req)
		if err != nil {
			return 0, err.Error()
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(got)
	}
	for i, chunked := range []bool{false, true} {
		if status, got := post("a=1&b=2", chunked); status != http.StatusOK || got != "a=1&b=2" {
			t.Fatalf("warming the pool: status %d, the upstream got %.80q", status, got)
		}
		dials := len(h.dialer.seen())
		if status, _ := post("a=1&b=2&_method=TRACE&c=3", chunked); status != 0 && status != http.StatusMethodNotAllowed {
			t.Errorf("chunked=%v: status %d, want 405", chunked, status)
		}
		testharness.Wait(t, "the upstream to read the body's cut", func() (bool, error) {
			return h.tlsUp.cutCount() == i+1, nil
		}, testharness.Within(30*time.Second))
		if len(h.dialer.seen()) != dials {
			t.Logf("chunked=%v: the refused form went on a new connection, not the pooled one", chunked)
		}
		if status, got := post("d=4", chunked); status != http.StatusOK || got != "d=4" {
			t.Errorf("chunked=%v: after the cut: status %d, the upstream got %.80q, want d=4", chunked, status, got)
		}
	}
	if n := h.tlsUp.count(); n != 4 {
		t.Errorf("the upstream got %d whole requests, want the 4 allowed", n)
	}
}

// TestFormOverrideEarlyIsAnswered: a form refused at its first pair while the sandbox is still
// sending megabytes of it is answered 405, on both paths: the proxy closed the connection
// with the body unread, the kernel reset it, and the sandbox's client read a reset where the
// 405 was (on the forwarded path: "connection reset by peer").
func TestFormOverrideEarlyIsAnswered(t *testing.T) {
	body := "_method=TRACE&" + largeForm(8<<20)
	for _, url := range []string{"http://plain.example.com/", "https://api.example.com/"} {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s chunked=%v", url, chunked), func(t *testing.T) {
				h := setup(t, nil)
				var r io.Reader = strings.NewReader(body)
				if chunked {
					r = io.MultiReader(r)
				}
				req, _ := http.NewRequest(http.MethodPost, url, r)
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				resp, err := h.client(t).Do(req)
				if err != nil {
					t.Fatalf("the sandbox's client got %v, want the 405", err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusMethodNotAllowed || err != nil || !strings.Contains(string(got), "TRACE") {
					t.Errorf("status %d %q (%v), want 405 naming TRACE", resp.StatusCode, got, err)
				}
				if n := h.plainUp.count() + h.tlsUp.count(); n != 0 {
					t.Errorf("the upstreams got %d whole requests, want none", n)
				}
			})
		}
	}
}

// TestFormOverrideAfterTheAnswerIsMethod: inside a terminated tunnel, a _method=TRACE the
// sandbox sends after the upstream has begun its answer is cut on its way as before it, and
// the request is recorded as refused, method: it was recorded allowed, intercepted, with the
// upstream's 200, while the server got no whole body.
func TestFormOverrideAfterTheAnswerIsMethod(t *testing.T) {
	h := setup(t, nil)
	tc, br := h.terminated(t, "api.example.com:443")
	first, rest := "a=1&b=", "2&_method=TRACE&c=3"
	if _, err := fmt.Fprintf(tc, "POST /duplex HTTP/1.1\r\nHost: api.example.com\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s",
		len(first)+len(rest), first); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the upstream's answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want the upstream's 200 before the body's end", resp.StatusCode)
	}
	if _, err := io.WriteString(tc, rest); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	testharness.Wait(t, "the upstream to read the body's cut", func() (bool, error) {
		return h.tlsUp.cutCount() == 1, nil
	}, testharness.Within(30*time.Second))
	d := h.waitDecision(t, "the request", withMethod(http.MethodPost))
	if d.Allowed || d.Reason != ReasonMethod || d.Status != http.StatusOK {
		t.Errorf("decision %+v, want refused, method, with the upstream's 200 it had answered", d)
	}
	if n := h.tlsUp.count(); n != 0 {
		t.Errorf("the upstream got %d whole requests, want none", n)
	}
}

// TestFormOverrideAnsweredBeforeTheBodysEnd: a kept-alive form refused at its first pair is
// answered while the sandbox has more of the body to send: the proxy read the rest of the body
// (closing the request's body reads it to its end on a kept-alive connection) before it
// answered, so a sandbox that sends the rest only once it is answered, or never, waited
// idle_timeout (5 minutes) for the 405.
func TestFormOverrideAnsweredBeforeTheBodysEnd(t *testing.T) {
	for _, tt := range []struct {
		name   string
		target string
	}{
		{"forwarded", "http://plain.example.com/"},
		{"terminated", "/"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, nil)
			var c net.Conn
			var br *bufio.Reader
			if tt.target == "/" {
				c, br = h.terminated(t, "api.example.com:443")
			} else {
				c = h.dialProxy(t)
				br = bufio.NewReader(c)
			}
			if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
			head := "POST " + tt.target + " HTTP/1.1\r\nHost: " + map[bool]string{true: "api.example.com", false: "plain.example.com"}[tt.target == "/"] +
				"\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1048576\r\n\r\n"
			if _, err := io.WriteString(c, head+"_method=TRACE&a="); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("reading the answer with the body's rest unsent: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("status %d, want 405", resp.StatusCode)
			}
		})
	}
}

// TestFormOverrideIsCutWhileTheSandboxIsRead: a forwarded form refused before its body's end
// has its upstream request cut at once, while the proxy still reads what the sandbox sends of
// the body (lingerClose), not once that is over.
func TestFormOverrideIsCutWhileTheSandboxIsRead(t *testing.T) {
	h := setup(t, nil)
	c := h.dialProxy(t)
	if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "POST http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n"+
		"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1048576\r\n\r\na=1&_method=TRACE&b="); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	resp.Body.Close()
	testharness.Wait(t, "the upstream to read the body's cut", func() (bool, error) {
		return h.plainUp.cutCount() == 1, nil
	}, testharness.Within(30*time.Second))
	if _, err := io.WriteString(c, strings.Repeat("x", 4096)); err != nil {
		t.Errorf("the sandbox's next bytes of the body: %v, want them read while the upstream is cut", err)
	}
}

// TestJobEndCutsALinger: a connection whose refusal the proxy lingers on (lingerClose), the
// sandbox still holding it open mid-body, is closed when the job ends, as every connection is:
// Serve returns at once, not after the linger's 10 s, on both paths.
func TestJobEndCutsALinger(t *testing.T) {
	for _, tunnel := range []bool{false, true} {
		t.Run(fmt.Sprintf("terminated=%v", tunnel), func(t *testing.T) {
			h := setup(t, nil)
			var c io.ReadWriter
			var br *bufio.Reader
			target, host := "http://plain.example.com/", "plain.example.com"
			if tunnel {
				tc, tbr := h.terminated(t, "api.example.com:443")
				c, br, target, host = tc, tbr, "/", "api.example.com"
			} else {
				pc := h.dialProxy(t)
				c, br = pc, bufio.NewReader(pc)
			}
			if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\n"+
				"Content-Length: 1048576\r\n\r\n_method=TRACE&a=", target, host); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			resp.Body.Close()
			start := time.Now()
			if err := h.stop(); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d >= lingerTimeout {
				t.Errorf("Serve returned %v after the job's end, want at once: the linger held it", d)
			}
		})
	}
}
