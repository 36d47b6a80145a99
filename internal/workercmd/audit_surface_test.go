package workercmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAuditNATSURLPasswordNeverInErrors: a NATS URL that carries a password (nats.url in the
// config, or NATS_URL) is shown redacted in every error, as queue.RedactURL promises ("what
// logs, /readyz and errors show"). A password that url.Parse cannot read (a '%' not followed by
// two hex digits, or a '/') makes nats.go's parse error quote the whole URL, and that error is
// wrapped after the redacted one: the password reaches the worker's stderr (its log) whole.
func TestAuditNATSURLPasswordNeverInErrors(t *testing.T) {
	t.Parallel()
	const secret = "Hunter2-s3cr%ZZet"
	url := "nats://boxcar:" + secret + "@127.0.0.1:1"
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "boxcar.yaml")
	cfg := "store: {url: \"file://" + filepath.Join(dir, "store") + "\"}\nnats: {url: \"" + url + "\"}\n" +
		"profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		run  func(ctx context.Context) (string, error)
	}{
		{"worker", func(ctx context.Context) (string, error) {
			w, err := Start(ctx, Options{ConfigPath: cfgPath, DataDir: dir, MetricsAddr: "127.0.0.1:0", Getenv: noEnv})
			if err == nil {
				w.Stop()
				_ = w.Wait()
			}
			return "", err
		}},
		{"worker setup", func(ctx context.Context) (string, error) {
			var out, errOut bytes.Buffer
			err := Run(ctx, []string{"setup", "--config", cfgPath}, noEnv, &out, &errOut)
			return out.String() + errOut.String(), err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := tt.run(t.Context())
			if err == nil {
				t.Fatal("no error from a NATS URL that cannot be parsed")
			}
			for _, leak := range []string{secret, "s3cr%ZZet"} {
				if strings.Contains(err.Error(), leak) || strings.Contains(out, leak) {
					t.Errorf("the NATS password reaches the error:\n%v\n%s", err, out)
					break
				}
			}
		})
	}
}
