package modelgate_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/boxcar-run/boxcar/internal/modelgate"
)

// TestAuditGateCountsABrokenBodyAsAFailure: an endpoint (or a proxy before it) that answers
// 200 and breaks the connection off before the body is sent gives no answer: the agent counts
// it as the endpoint unavailable (agent.modelError: "one whose body broke off while it was
// read" is ErrModelUnavailable) and the OpenAI client retries it. The gate judges the request
// by its status line alone, so it never opens on such an endpoint: boxcar_model_up reads 1,
// /readyz says ready and the worker keeps fetching jobs whose every turn fails.
func TestAuditGateCountsABrokenBodyAsAFailure(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":")
		_ = buf.Flush()
		conn.Close()
	}))
	t.Cleanup(broken.Close)
	g, c, _ := setup(t, e, modelgate.Config{Threshold: 3})
	for range 3 {
		resp, err := c.Post(broken.URL+"/v1/chat/completions", "application/json", nil)
		if err != nil {
			t.Fatalf("the status line should arrive: %v", err)
		}
		_, readErr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if readErr == nil {
			t.Fatal("the body was read whole; the test's server is wrong")
		}
	}
	if g.Up() {
		t.Errorf("the gate is still closed (boxcar_model_up 1) after 3 requests in a row whose answers broke off; want it open, as after 3 refused connections")
	}
}
