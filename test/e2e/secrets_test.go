//go:build integration

package e2e

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/queue/natsauthtest"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// TestSecretsStayOut runs the real worker against a real nats-server that wants a login, each
// way a deployment gives one, and submit against it and against a server that is not there;
// the worker's log, its stdout, /readyz (ready and not) and submit's output and errors hold
// none of the passwords, tokens, seeds or API keys used.
func TestSecretsStayOut(t *testing.T) {
	t.Parallel()
	certs := natsauthtest.NewCerts(t)
	op := natsauthtest.NewOperator(t)
	const password, token, apiKey = "pw-e2e-91c4-secret", "tok-e2e-5a7f-secret", "sk-e2e-3b8d-secret"
	secrets := []string{password, token, apiKey, op.Seed}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type login struct {
		name   string
		server natsauthtest.Server
		env    func(natsURL string) map[string]string
	}
	withPassword := func(u string) string {
		x, _ := url.Parse(u)
		x.User = url.UserPassword("ann", password)
		return x.String()
	}
	logins := []login{
		{name: "password in NATS_URL", server: natsauthtest.Server{Users: map[string]string{"ann": password}, JetStream: true},
			env: func(u string) map[string]string { return map[string]string{"NATS_URL": withPassword(u)} }},
		{name: "token file", server: natsauthtest.Server{Token: token, JetStream: true},
			env: func(u string) map[string]string {
				return map[string]string{"NATS_URL": u, "NATS_TOKEN_FILE": tokenFile}
			}},
		{name: "creds over mTLS", server: natsauthtest.Server{Operator: &op, TLS: &certs, VerifyClients: true, JetStream: true},
			env: func(u string) map[string]string {
				return map[string]string{"NATS_URL": strings.Replace(u, "nats://", "tls://", 1), "NATS_CREDS": op.CredsFile,
					"NATS_CA": certs.CA, "NATS_CERT": certs.ClientCert, "NATS_KEY": certs.ClientKey}
			}},
	}
	for _, l := range logins {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			ns := natsauthtest.Start(t, l.server)
			env := l.env(ns.ClientURL())
			env["OPENAI_API_KEY"], env["OPENAI_BASE_URL"] = apiKey, "http://127.0.0.1:1/v1"
			env["BOXCAR_STORE"], env["BOXCAR_HOME"] = "file://"+filepath.Join(t.TempDir(), "store"), t.TempDir()
			cfg := filepath.Join(t.TempDir(), "boxcar.yaml")
			if err := os.WriteFile(cfg, []byte("profiles:\n  p:\n    model:\n      name: m\n    tools:\n      - name: read_file\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			w := testworker.Start(t, testworker.Config{ConfigFile: cfg, Model: env["OPENAI_BASE_URL"], Env: env})
			log, out, addr := w.Log, w.Out, w.Addrs().Metrics
			_, ready := httpGet(t, "http://"+addr+"/readyz")

			// submit through the same login works, and its errors against a server that is
			// gone, with the same secrets, name none of them.
			sout, err := submitWith(t, env, "status", "20261202t101500-abcdef012345")
			if err == nil || !strings.Contains(sout+err.Error(), "unknown job") {
				t.Errorf("submit status of an unknown job through %s: %v\n%s; want unknown job", l.name, err, sout)
			}
			gone := map[string]string{}
			for k, v := range env {
				gone[k] = v
			}
			gone["NATS_URL"] = strings.Replace(env["NATS_URL"], ns.Addr().String(), "127.0.0.1:1", 1)
			gout, gerr := submitWith(t, gone, "status", "20261202t101500-abcdef012345")
			if gerr == nil {
				t.Fatal("submit reached a server that is not there")
			}
			ns.Shutdown() // /readyz now says why the worker is not ready
			harness.Wait(t, "/readyz says NATS is down", func() (bool, error) {
				_, b := httpGet(t, "http://"+addr+"/readyz")
				return strings.Contains(string(b), "not connected"), errors.New(string(b))
			}, harness.Within(30*time.Second))
			_, notReady := httpGet(t, "http://"+addr+"/readyz")
			for where, text := range map[string]string{
				"the worker's log": log.String(), "the worker's stdout": out.String(), "/readyz": string(ready),
				"/readyz while NATS is down": string(notReady), "submit's output": sout + gout, "submit's error": gerr.Error(),
			} {
				for _, s := range secrets {
					if strings.Contains(text, s) {
						t.Errorf("%s holds the secret %s…:\n%s", where, s[:6], text)
					}
				}
			}
		})
	}
}
