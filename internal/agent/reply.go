package agent

import (
	"errors"
	"io"
	"net/http"

	"github.com/openai/openai-go/v3/option"
)

// maxReplyHead is how much of an answer's body a reply keeps: enough for an excerpt of
// maxErrorMessage bytes once an API key in it is redacted.
const maxReplyHead = 1 << 10

// reply is what the endpoint answered to the last attempt of one chat request, as its
// middleware (record) saw it. openai-go reports a body it cannot decode without the answer's
// status, and modelError classifies by the status.
type reply struct {
	status int // 0: no response
	// head is the first maxReplyHead bytes of the body, as far as the client read it.
	head []byte
	// readErr is why reading the body failed before its end (a reset connection, the
	// attempt's timeout); nil when it was read whole or cut at Config.MaxResponseBytes.
	readErr error
	wire    wireBytes
}

// wireBytes are the bodies of one request and its answer as a token estimate counts them: the
// answer's as it is read, the request's only when countUsage needs it (sentBody).
type wireBytes struct {
	sent sentBody
	got  textCost
}

// record is the request's middleware that fills rp with each attempt's answer.
func (rp *reply) record(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	*rp = reply{}
	rp.wire.sent = sentBody{length: req.ContentLength, get: req.GetBody}
	res, err := next(req)
	if err == nil {
		rp.status = res.StatusCode
		if res.Body != nil {
			res.Body = &replyBody{rc: res.Body, rp: rp}
		}
	}
	return res, err
}

// replyBody keeps the head of the body it reads, and a read's failure, in rp.
type replyBody struct {
	rc io.ReadCloser
	rp *reply
}

func (b *replyBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	_, _ = b.rp.wire.got.Write(p[:n])
	if room := maxReplyHead - len(b.rp.head); room > 0 {
		b.rp.head = append(b.rp.head, p[:min(n, room)]...)
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, errResponseTooLarge) {
		b.rp.readErr = err
	}
	return n, err
}

func (b *replyBody) Close() error { return b.rc.Close() }

// sentBody is a request's body as the estimate counts it: later, and only when the endpoint's
// usage report is not plausible by the bound alone (countUsage). Counting streams every byte
// (some ms a MiB), and a conversation's request holds all of it, on every turn.
type sentBody struct {
	length int64                         // ContentLength: -1 when unknown
	get    func() (io.ReadCloser, error) // GetBody: a copy of the body (openai-go holds it in memory)
}

// bound is the most tokens the body's estimate can be: a byte counts at most one
// (a lone lead byte beyond ASCII), plus the rounding up of two terms; ok is false when the
// length is unknown.
func (s sentBody) bound() (n int64, ok bool) {
	return s.length + 2, s.length >= 0
}

// cost is the estimate of the body, read from a copy, or, without one, its length counted as
// plain text.
func (s sentBody) cost() textCost {
	if s.get != nil {
		if body, err := s.get(); err == nil {
			var c textCost
			_, err := io.Copy(&c, body)
			body.Close()
			if err == nil {
				return c
			}
		}
	}
	return textCost{plain: max(s.length, 0)}
}
