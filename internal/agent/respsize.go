package agent

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/openai/openai-go/v3/option"
)

// errResponseTooLarge is the read error of an answer's body past Config.MaxResponseBytes;
// modelError makes it ErrModelResponse.
var errResponseTooLarge = errors.New("the answer's body is larger than the agent accepts")

// capBody is the client middleware that bounds every answer's body to limit bytes. It fails the
// read, not the attempt: an attempt's error would be retried as a connection error, and the
// same endpoint would send the same body again.
func capBody(limit int64) option.Middleware {
	return func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		res, err := next(req)
		if err == nil && res.Body != nil {
			res.Body = &cappedBody{rc: res.Body, left: limit, limit: limit}
		}
		return res, err
	}
}

// cappedBody reads at most limit bytes of rc; the read that would pass it fails.
type cappedBody struct {
	rc          io.ReadCloser
	left, limit int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1] // one byte more than is left tells a body of exactly limit from a longer one
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return 0, fmt.Errorf("%w: more than %d bytes (Config.MaxResponseBytes); check the endpoint's base URL and any proxy in front of it, or set the profile's max_completion_tokens",
			errResponseTooLarge, b.limit)
	}
	return n, err
}

func (b *cappedBody) Close() error { return b.rc.Close() }
