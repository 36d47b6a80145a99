//go:build integration

// Package tenancy tries, as a platform team would, every way one tenant or one role could act
// as another against a real nats-server configured by `worker nats-config` (two tenants, TLS
// with client certificates), and checks the server refuses each one while each role's own
// path works.
package tenancy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/natsconfig"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/natsauthtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// deployment is a nats-server from a generated configuration and the identities' files.
type deployment struct {
	url   string // tls://127.0.0.1:port
	certs natsauthtest.Certs
	creds map[string]string // identity name -> .creds file
	names natsconfig.Names
	// seeds are every user seed of the generation, for the scan for secrets.
	seeds []string
}

var tenants = []string{"team-a", "team-b"}

// deploy generates the identities for two tenants with mTLS and starts the real server from
// the generated file, in-process.
func deploy(t *testing.T) *deployment {
	t.Helper()
	dir, certs := t.TempDir(), natsauthtest.NewCerts(t)
	names := natsconfig.NamesOf(config.Config{}.WithDefaults().NATS)
	res, err := natsconfig.Generate(natsconfig.Options{
		Dir: filepath.Join(dir, "nats"), Names: names, Tenants: tenants, Listen: "127.0.0.1:-1",
		StoreDir: filepath.Join(dir, "js"), TLS: &natsconfig.TLS{Cert: certs.ServerCert, Key: certs.ServerKey, ClientCA: certs.CA},
	})
	if err != nil {
		t.Fatal(err)
	}
	ns := natsauthtest.StartFromConfig(t, res.ServerConfig)
	d := &deployment{url: strings.Replace(ns.ClientURL(), "nats://", "tls://", 1), certs: certs, creds: res.Creds, names: names}
	for _, f := range res.Creds {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := jwt.ParseDecoratedUserNKey(data)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		d.seeds = append(d.seeds, string(seed))
	}
	return d
}

// userKey is an identity's public key, which names its inbox.
func (d *deployment) userKey(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(d.creds[name])
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return uc.Subject
}

// connOptions are the options `worker` and `submit` would use for an identity: its .creds file
// over mTLS.
func (d *deployment) connOptions(name string) queue.ConnOptions {
	return queue.ConnOptions{
		URL: d.url, Name: "tenancy-" + name, CredsFile: d.creds[name],
		CAFile: d.certs.CA, CertFile: d.certs.ClientCert, KeyFile: d.certs.ClientKey,
	}
}

// conn is a connection as one identity that records what the server refused it.
type conn struct {
	nc *nats.Conn
	js jetstream.JetStream
	mu sync.Mutex
	// violations are the server's permission errors for this connection; violated is closed
	// at the first.
	violations []string
	violated   chan struct{}
}

// connect logs in as an identity through queue.Connect, the path of worker and submit.
func (d *deployment) connect(t *testing.T, name string) *conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, err := queue.Connect(ctx, d.connOptions(name))
	if err != nil {
		t.Fatalf("connect as %s: %v", name, err)
	}
	c := &conn{nc: nc, violated: make(chan struct{})}
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if isViolation(err) {
			c.mu.Lock()
			if len(c.violations) == 0 {
				close(c.violated)
			}
			c.violations = append(c.violations, err.Error())
			c.mu.Unlock()
		}
	})
	t.Cleanup(nc.Close)
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return c
}

func isViolation(err error) bool {
	return err != nil && (errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation"))
}

// try runs an attempt until it returns or the server refuses it: a refused request gets no
// answer, so waiting for one would only wait out the timeout.
func (c *conn) try(ctx context.Context, f func(context.Context, *conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	go func() {
		select {
		case <-c.violated:
			cancel()
		case <-ctx.Done():
		}
	}()
	return f(ctx, c)
}

// refused reports whether the server refused what the connection did: the call's error, or a
// permissions violation the server sent the connection, which for a publish or a subscription
// arrives after the call returned: a flush's round trip brings it (the server answers in
// order), and nats.go hands it to the error handler soon after.
func (c *conn) refused(ctx context.Context, err error) (bool, string) {
	if isViolation(err) {
		return true, err.Error()
	}
	_ = c.nc.Flush()
	var v []string
	_ = harness.Poll(ctx, 10*time.Second, "a permissions violation", func(context.Context) (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v = append(v[:0], c.violations...)
		return len(v) > 0, nil
	})
	switch {
	case len(v) > 0:
		return true, v[0]
	case err != nil:
		return false, err.Error()
	}
	return false, "no error"
}

// noSecrets fails the test when text holds any of the secrets (seeds, passwords, keys).
func noSecrets(t *testing.T, where, text string, secrets []string) {
	t.Helper()
	if len(secrets) == 0 {
		t.Fatal("no secrets to look for: the scan would find nothing")
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s hold a secret (%s…)", where, s[:4])
		}
	}
}
