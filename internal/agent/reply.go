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

// wireBytes are the bodies of one request and its answer as a token estimate counts them.
type wireBytes struct{ sent, got textCost }

// record is the request's middleware that fills rp with each attempt's answer.
func (rp *reply) record(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	*rp = reply{}
	rp.wire.sent = bodyCost(req)
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

// bodyCost is the estimate of the request's body, read from a copy (GetBody: openai-go holds the
// body in memory), or, without one, its length counted as plain text.
func bodyCost(req *http.Request) textCost {
	if req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			var c textCost
			_, err := io.Copy(&c, body)
			body.Close()
			if err == nil {
				return c
			}
		}
	}
	return textCost{plain: max(req.ContentLength, 0)}
}
