package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/natsauthtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestConnectLogins connects through the one connection path to a real nats-server secured
// each way NATS deployments use, with the right credentials and with wrong or missing ones; a
// refusal's error names none of the secrets.
func TestConnectLogins(t *testing.T) {
	t.Parallel()
	certs := natsauthtest.NewCerts(t)
	nkeyPub, seedFile := natsauthtest.NKeyUser(t)
	_, otherSeed := natsauthtest.NKeyUser(t)
	op := natsauthtest.NewOperator(t)
	other := natsauthtest.NewOperator(t)
	const password, token = "pw-3f9a1c-secret", "tok-77be20-secret"
	secrets := []string{password, token, op.Seed, "wrong-pw-secret", "wrong-tok-secret"}

	withUser := func(u string) func(*server.Server, *queue.ConnOptions) {
		return func(ns *server.Server, o *queue.ConnOptions) {
			x, _ := url.Parse(ns.ClientURL())
			x.User = url.UserPassword("ann", u)
			o.URL = x.String()
		}
	}
	tests := []struct {
		name   string
		server natsauthtest.Server
		opts   queue.ConnOptions
		adjust func(*server.Server, *queue.ConnOptions) // options that need the server's URL
		ok     bool
	}{
		{name: "user and password", server: natsauthtest.Server{Users: map[string]string{"ann": password}}, opts: queue.ConnOptions{User: "ann", Password: password}, ok: true},
		{name: "wrong password", server: natsauthtest.Server{Users: map[string]string{"ann": password}}, opts: queue.ConnOptions{User: "ann", Password: "wrong-pw-secret"}},
		{name: "password in the URL", server: natsauthtest.Server{Users: map[string]string{"ann": password}}, adjust: withUser(password), ok: true},
		{name: "wrong password in the URL", server: natsauthtest.Server{Users: map[string]string{"ann": password}}, adjust: withUser("wrong-pw-secret")},
		{name: "no login to a server with users", server: natsauthtest.Server{Users: map[string]string{"ann": password}}},
		{name: "token", server: natsauthtest.Server{Token: token}, opts: queue.ConnOptions{Token: token}, ok: true},
		{name: "wrong token", server: natsauthtest.Server{Token: token}, opts: queue.ConnOptions{Token: "wrong-tok-secret"}},
		{name: "nkey", server: natsauthtest.Server{NKeys: []string{nkeyPub}}, opts: queue.ConnOptions{NKeyFile: seedFile}, ok: true},
		{name: "unknown nkey", server: natsauthtest.Server{NKeys: []string{nkeyPub}}, opts: queue.ConnOptions{NKeyFile: otherSeed}},
		{name: "creds (operator JWT)", server: natsauthtest.Server{Operator: &op}, opts: queue.ConnOptions{CredsFile: op.CredsFile}, ok: true},
		{name: "creds of another operator", server: natsauthtest.Server{Operator: &op}, opts: queue.ConnOptions{CredsFile: other.CredsFile}},
		{name: "TLS with the private CA", server: natsauthtest.Server{TLS: &certs}, opts: queue.ConnOptions{CAFile: certs.CA}, ok: true},
		{name: "TLS with the system roots only", server: natsauthtest.Server{TLS: &certs}},
		{name: "TLS with another CA", server: natsauthtest.Server{TLS: &certs}, opts: queue.ConnOptions{CAFile: certs.OtherCA}},
		{name: "mTLS with a client certificate", server: natsauthtest.Server{TLS: &certs, VerifyClients: true},
			opts: queue.ConnOptions{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, ok: true},
		{name: "mTLS without a client certificate", server: natsauthtest.Server{TLS: &certs, VerifyClients: true}, opts: queue.ConnOptions{CAFile: certs.CA}},
		{name: "mTLS and creds", server: natsauthtest.Server{TLS: &certs, VerifyClients: true, Operator: &op},
			opts: queue.ConnOptions{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey, CredsFile: op.CredsFile}, ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := natsauthtest.Start(t, tt.server)
			o := tt.opts
			o.URL, o.Name = ns.ClientURL(), "test"
			if tt.adjust != nil {
				tt.adjust(ns, &o)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			nc, err := queue.Connect(ctx, o)
			if err == nil {
				defer nc.Close()
				err = nc.FlushWithContext(ctx)
			}
			switch {
			case tt.ok && err != nil:
				t.Fatalf("connect: %v", err)
			case !tt.ok && err == nil:
				t.Fatal("connected; want a refusal")
			case err != nil:
				noSecrets(t, "the error", err.Error(), secrets)
			}
		})
	}
}

// TestDialLogin: the worker's link logs in the same way, and its state for /readyz names the
// server without the password.
func TestDialLogin(t *testing.T) {
	t.Parallel()
	const password = "pw-link-5d1e-secret"
	ns := natsauthtest.Start(t, natsauthtest.Server{Users: map[string]string{"ann": password}})
	u, _ := url.Parse(ns.ClientURL())
	u.User = url.UserPassword("ann", "wrong-"+password)
	logs := &harness.LogBuffer{}
	link, err := queue.Dial(queue.ConnOptions{URL: u.String(), Name: "test"}, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	harness.Wait(t, "the link to say why it is not connected", func() (bool, error) {
		err := link.Err()
		return err != nil && strings.Contains(err.Error(), "uthorization"), fmt.Errorf("the link's error: %v", err)
	}, harness.Within(10*time.Second))
	noSecrets(t, "/readyz's nats line", link.Err().Error(), []string{password})
	noSecrets(t, "the log", logs.String(), []string{password})
}

func TestConnOptionsRefuseBadCombinations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts queue.ConnOptions
	}{
		{name: "creds and token", opts: queue.ConnOptions{CredsFile: "/dev/null", Token: "x"}},
		{name: "user and nkey", opts: queue.ConnOptions{User: "u", NKeyFile: "/dev/null"}},
		{name: "password alone", opts: queue.ConnOptions{Password: "p"}},
		{name: "certificate without key", opts: queue.ConnOptions{CertFile: "/dev/null"}},
		{name: "missing CA file", opts: queue.ConnOptions{CAFile: "/nonexistent/ca.pem"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := queue.Connect(t.Context(), tt.opts); err == nil {
				t.Fatal("connected; want the options refused")
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://ann:pw@host:4222", "nats://redacted@host:4222"},
		{"nats://tok@host:4222,nats://bob:pw2@other:4222", "nats://redacted@host:4222,nats://redacted@other:4222"},
		{"tls://a%zz:pw@host:4222", "tls://redacted@host:4222"},
	}
	for _, tt := range tests {
		if got := queue.RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestURLThatDoesNotParseHoldsNoPassword: Connect and Dial refuse a URL whose password does
// not parse before nats.go sees it: nats.go's error quotes the whole URL, password and all.
func TestURLThatDoesNotParseHoldsNoPassword(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"nats://boxcar:s3cr%ZZet@127.0.0.1:1",
		"nats://127.0.0.1:1, tls://boxcar:s3cr/et@127.0.0.1:2",
		"boxcar:s3cr?et@127.0.0.1:1",
	} {
		o := queue.ConnOptions{URL: u, Timeout: time.Second}
		_, cerr := queue.Connect(t.Context(), o)
		_, derr := queue.Dial(o, slog.New(slog.DiscardHandler))
		for name, err := range map[string]error{"Connect": cerr, "Dial": derr} {
			if err == nil {
				t.Fatalf("%s(%s…): no error", name, u[:10])
			}
			noSecrets(t, name, err.Error(), []string{"s3cr"})
		}
	}
}

func TestLoopbackOnly(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"": true, "nats://127.0.0.1:4222": true, "nats://localhost:4222,nats://[::1]:4222": true,
		"127.0.0.2:4222": true, "nats://10.0.0.1:4222": false, "nats://127.0.0.1:4222,nats://nats.example:4222": false,
	} {
		if got := queue.LoopbackOnly(in); got != want {
			t.Errorf("LoopbackOnly(%q) = %v, want %v", in, got, want)
		}
	}
}

// noSecrets fails when text holds any of secrets.
func noSecrets(t *testing.T, where, text string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s holds a secret (%s…): %s", where, s[:min(4, len(s))], text)
		}
	}
}

// TestInboxOfItsOwn: a creds or nkey login takes _INBOX.<its user's public key> as its inbox
// prefix, the only inbox `worker nats-config` lets that identity subscribe to; a password
// login keeps nats.go's.
func TestInboxOfItsOwn(t *testing.T) {
	t.Parallel()
	nkeyPub, seedFile := natsauthtest.NKeyUser(t)
	op := natsauthtest.NewOperator(t)
	cases := []struct {
		name   string
		server natsauthtest.Server
		opts   queue.ConnOptions
		prefix string
	}{
		{"nkey", natsauthtest.Server{NKeys: []string{nkeyPub}}, queue.ConnOptions{NKeyFile: seedFile}, "_INBOX." + nkeyPub + "."},
		{"creds", natsauthtest.Server{Operator: &op}, queue.ConnOptions{CredsFile: op.CredsFile}, "_INBOX." + op.UserPub + "."},
		{"password", natsauthtest.Server{Users: map[string]string{"ann": "pw"}}, queue.ConnOptions{User: "ann", Password: "pw"}, "_INBOX."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := natsauthtest.Start(t, c.server)
			c.opts.URL = ns.ClientURL()
			nc, err := queue.Connect(context.Background(), c.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			inbox := nc.NewInbox()
			if !strings.HasPrefix(inbox, c.prefix) || strings.Count(inbox, ".") != strings.Count(c.prefix, ".") {
				t.Errorf("inbox %s, want %s<id>", inbox, c.prefix)
			}
		})
	}
}
