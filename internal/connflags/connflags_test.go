package connflags_test

import (
	"bytes"
	"encoding/pem"
	"flag"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/connflags"
	"github.com/boxcar-run/boxcar/internal/queue"
)

func TestOptions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("pw-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Options opens every file it is given; what they hold is checked where they are used.
	file := func(name string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	envCreds, flagCreds, ca, cert, key := file("env.creds"), file("flag.creds"), file("ca"), file("c"), file("k")
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    queue.ConnOptions
		wantErr bool
	}{
		{name: "nothing", want: queue.ConnOptions{}},
		{name: "creds from the environment", env: map[string]string{"NATS_CREDS": envCreds}, want: queue.ConnOptions{CredsFile: envCreds}},
		{name: "the flag wins", args: []string{"-nats-creds", flagCreds}, env: map[string]string{"NATS_CREDS": filepath.Join(dir, "none")}, want: queue.ConnOptions{CredsFile: flagCreds}},
		{name: "password file", args: []string{"-nats-user", "ann", "-nats-password-file", pwFile}, want: queue.ConnOptions{User: "ann", Password: "pw-from-file"}},
		{name: "password from the environment", env: map[string]string{"NATS_USER": "ann", "NATS_PASSWORD": "pw-env"}, want: queue.ConnOptions{User: "ann", Password: "pw-env"}},
		{name: "token file from the environment", env: map[string]string{"NATS_TOKEN_FILE": pwFile}, want: queue.ConnOptions{Token: "pw-from-file"}},
		{name: "mTLS", env: map[string]string{"NATS_CA": ca, "NATS_CERT": cert, "NATS_KEY": key}, want: queue.ConnOptions{CAFile: ca, CertFile: cert, KeyFile: key}},
		{name: "missing token file", args: []string{"-nats-token-file", filepath.Join(dir, "none")}, wantErr: true},
		{name: "missing creds file", env: map[string]string{"NATS_CREDS": filepath.Join(dir, "none")}, wantErr: true},
		{name: "missing CA file", args: []string{"-nats-ca", filepath.Join(dir, "none")}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var n connflags.NATS
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			n.Bind(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := n.Options("nats://127.0.0.1:4222", "t", func(k string) string { return tt.env[k] })
			if (err != nil) != tt.wantErr {
				t.Fatalf("Options: %v, want error %v", err, tt.wantErr)
			}
			tt.want.URL, tt.want.Name = "nats://127.0.0.1:4222", "t"
			if err == nil && got != tt.want {
				t.Errorf("Options = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestWithEmbeddedToken: submit on this machine finds the embedded worker's token, and never
// sends it to another host or in place of a login it was given.
func TestWithEmbeddedToken(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, connflags.EmbeddedTokenFile), []byte("local-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		in   queue.ConnOptions
		want string
	}{
		{name: "loopback", in: queue.ConnOptions{URL: "nats://127.0.0.1:4222"}, want: "local-token"},
		{name: "the default URL", in: queue.ConnOptions{}, want: "local-token"},
		{name: "another host", in: queue.ConnOptions{URL: "nats://nats.example:4222"}},
		{name: "a login of its own", in: queue.ConnOptions{URL: "nats://127.0.0.1:4222", CredsFile: "/x.creds"}},
	} {
		got, err := connflags.WithEmbeddedToken(tt.in, home)
		if err != nil || got.Token != tt.want {
			t.Errorf("%s: token %q, %v; want %q", tt.name, got.Token, err, tt.want)
		}
	}
}

func TestTransportTrustsTheCAFile(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	plain, err := connflags.Transport("")
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := (&http.Client{Transport: plain}).Get(srv.URL); err == nil {
		resp.Body.Close()
		t.Fatal("the system roots trusted the test server")
	}
	tr, err := connflags.Transport(ca)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatalf("with the CA file: %v", err)
	}
	resp.Body.Close()
	if _, err := connflags.Transport(filepath.Join(t.TempDir(), "none.pem")); err == nil {
		t.Error("a missing CA file was accepted")
	}
}

func TestWarnPlaintextKey(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url, key string
		warn     bool
	}{
		{"http://model.example/v1", "sk-x", true},
		{"https://model.example/v1", "sk-x", false},
		{"http://127.0.0.1:8080/v1", "sk-x", false},
		{"http://localhost:8080/v1", "sk-x", false},
		{"http://model.example/v1", "", false},
	} {
		var buf bytes.Buffer
		connflags.WarnPlaintextKey(slog.New(slog.NewJSONHandler(&buf, nil)), tt.url, tt.key)
		if got := strings.Contains(buf.String(), "plain http"); got != tt.warn || strings.Contains(buf.String(), "sk-x") {
			t.Errorf("%s with key %q: log %q; want a warning %v and never the key", tt.url, tt.key, buf.String(), tt.warn)
		}
	}
}
