// Package bodyend tells when an HTTP response body ends: read to its end, broken off, or
// closed before its end. A model answer is judged then, not by its status line: a 200 whose
// body breaks off or stalls is no answer.
package bodyend

import (
	"errors"
	"io"
	"sync"
)

// Watch returns rc that calls end once, when the body ends: with nil when it was read to its
// end or closed before it, with the read's error when it broke off.
func Watch(rc io.ReadCloser, end func(readErr error)) io.ReadCloser {
	return &body{ReadCloser: rc, end: end}
}

type body struct {
	io.ReadCloser
	once sync.Once
	end  func(readErr error)
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		readErr := err
		if errors.Is(err, io.EOF) {
			readErr = nil
		}
		b.once.Do(func() { b.end(readErr) })
	}
	return n, err
}

func (b *body) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.end(nil) })
	return err
}
