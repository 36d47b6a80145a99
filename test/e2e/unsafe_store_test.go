//go:build integration

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

// TestWorkerRefusesAStoreThatOverwrites (issue 10 item 7): on an S3 server that ignores
// If-None-Match (a proxy in front of versitygw plays one), the worker does not start, and says
// what the server does and which setting runs it anyway; with that setting it starts and warns.
func TestWorkerRefusesAStoreThatOverwrites(t *testing.T) {
	s3 := s3test.Start(t)
	bucket := s3.CreateBucket(t)
	s3.Env(t)
	lenient := s3test.NewLenientProxy(t, s3, s3test.IgnorePut)
	ns := startNATS(t)
	sections := func(extra string) string {
		return fmt.Sprintf("nats:\n  url: %s\nstore:\n  url: s3://%s\n  endpoint: %s\n  region: %s\n  path_style: true\n%s",
			ns.ClientURL(), bucket, lenient.URL, s3test.Region, extra)
	}

	cfg := filepath.Join(t.TempDir(), "boxcar.yaml")
	writeText(t, cfg, string(examples.Config)+"\nsandbox:\n  backend: bubblewrap\n"+sections(""))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := &syncBuffer{}
	env := mapEnv(map[string]string{"OPENAI_BASE_URL": demoModel(t), "OPENAI_API_KEY": e2eAPIKey})
	err := workercmd.Run(ctx, []string{"--config", cfg, "--metrics-addr", freeAddr(t)}, env, &syncBuffer{}, log)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("worker on a server that ignores If-None-Match: %v; want it to refuse to start\n%s", err, log.String())
	}
	for _, want := range []string{"If-None-Match", "store.allow_unsafe_overwrite"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the worker's error does not name %q: %v", want, err)
		}
	}
	if strings.Contains(log.String(), `"msg":"worker ready"`) {
		t.Errorf("the worker said it was ready:\n%s", log.String())
	}

	w := startWorkerWith(t, demoModel(t), sections("  allow_unsafe_overwrite: true\n"),
		map[string]string{"NATS_URL": ns.ClientURL(), "BOXCAR_STORE": "s3://" + bucket, "BOXCAR_S3_ENDPOINT": s3.Endpoint})
	w.waitLog(t, regexp.MustCompile(`"msg":"worker ready"`), 1, 60*time.Second)
	if n := w.count(regexp.MustCompile(`"level":"WARN","msg":"store: the S3 server does not honour create-only writes`)); n != 1 {
		t.Errorf("the worker warned %d times about the unsafe server, want once:\n%s", n, w.log.String())
	}
}
