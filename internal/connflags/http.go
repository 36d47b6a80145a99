package connflags

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// Transport returns a clone of http.DefaultTransport that trusts the CAs of caFile (PEM) besides
// the system's, for an S3-compatible store or a model endpoint behind a private CA. With no
// file it is the plain clone.
func Transport(caFile string) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if caFile == "" {
		return t, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
	}
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return t, nil
}

// WarnPlaintextKey logs, once per call (the worker calls it at start), when an API key would go over plain http:// to a host that is not
// this machine, where anyone on the path can read it. It names the host, never the key.
func WarnPlaintextKey(log *slog.Logger, baseURL, apiKey string) {
	u, err := url.Parse(baseURL)
	if apiKey == "" || err != nil || u.Scheme != "http" || queue.IsLoopbackHost(u.Hostname()) {
		return
	}
	log.Warn("the model API key is sent over plain http to a host that is not this machine; use https (a private CA: --model-ca)",
		"model_host", u.Host)
}
