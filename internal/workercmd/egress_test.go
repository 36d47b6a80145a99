package workercmd

import (
	"slices"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestWorkerEndpoints: each endpoint is denied on the port the worker reaches it on, the
// scheme's default when the URL names none (an http:// store or model listens on 80).
func TestWorkerEndpoints(t *testing.T) {
	tests := []struct {
		name             string
		nats, store, mdl string
		want             []string
	}{
		{"explicit ports", "nats://nats:4222", "http://minio:9000", "http://ollama:11434",
			[]string{"nats:4222", "minio:9000", "ollama:11434"}},
		{"nats default, cluster of two", "nats://a, nats://b:4223", "", "",
			[]string{"a:4222", "b:4223"}},
		{"https defaults", "", "https://s3.internal", "https://model.internal/v1",
			[]string{"s3.internal:443", "model.internal:443"}},
		{"http defaults to 80", "", "http://minio.internal", "http://model-gateway/v1",
			[]string{"minio.internal:80", "model-gateway:80"}},
		{"tls nats", "tls://nats.internal", "", "", []string{"nats.internal:4222"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg config.Config
			cfg.NATS.URL, cfg.Store.Endpoint = tt.nats, tt.store
			if got := workerEndpoints(cfg, tt.mdl); !slices.Equal(got, tt.want) {
				t.Fatalf("workerEndpoints = %q, want %q", got, tt.want)
			}
		})
	}
}
