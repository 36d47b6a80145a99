// Package connflags is the one place where the worker and submit read how to reach NATS, the S3
// store and the model endpoint securely: the flags, their environment variables, the secret
// files behind them and the CA bundles. It turns them into queue.ConnOptions and HTTP clients;
// it connects to nothing itself. Secrets come from files or the environment only, never from
// a flag's value, which any local user can read in the process list.
package connflags

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// FlagSet is what both CLIs' flag sets offer (the standard library's and pflag's).
type FlagSet interface {
	StringVar(p *string, name, value, usage string)
}

// NATS holds the NATS credential and TLS flags as given; Options resolves them with the
// environment.
type NATS struct {
	creds, nkey, user, passwordFile, tokenFile, ca, cert, key string
}

// Env names the environment variables the flags fall back to, for docs and tests.
var Env = struct {
	Creds, NKey, User, Password, PasswordFile, Token, TokenFile, CA, Cert, Key string
}{"NATS_CREDS", "NATS_NKEY", "NATS_USER", "NATS_PASSWORD", "NATS_PASSWORD_FILE", "NATS_TOKEN", "NATS_TOKEN_FILE", "NATS_CA", "NATS_CERT", "NATS_KEY"}

// Bind adds the flags to fs.
func (n *NATS) Bind(fs FlagSet) {
	fs.StringVar(&n.creds, "nats-creds", "", "NATS .creds `FILE` (user JWT and nkey seed) (default $NATS_CREDS)")
	fs.StringVar(&n.nkey, "nats-nkey", "", "NATS nkey seed `FILE` (default $NATS_NKEY)")
	fs.StringVar(&n.user, "nats-user", "", "NATS user `NAME` (default $NATS_USER); the password from --nats-password-file, $NATS_PASSWORD_FILE or $NATS_PASSWORD")
	fs.StringVar(&n.passwordFile, "nats-password-file", "", "`FILE` holding the NATS user's password (default $NATS_PASSWORD_FILE)")
	fs.StringVar(&n.tokenFile, "nats-token-file", "", "`FILE` holding the NATS token (default $NATS_TOKEN_FILE, else the token in $NATS_TOKEN)")
	fs.StringVar(&n.ca, "nats-ca", "", "PEM `FILE` of the CAs that sign the NATS server's certificate (default $NATS_CA)")
	fs.StringVar(&n.cert, "nats-cert", "", "client certificate (PEM) `FILE` for NATS servers that verify clients (default $NATS_CERT)")
	fs.StringVar(&n.key, "nats-key", "", "key (PEM) `FILE` of --nats-cert (default $NATS_KEY)")
}

// Names lists the flags Bind adds, for callers that annotate them.
func (n *NATS) Names() []string {
	return []string{"nats-creds", "nats-nkey", "nats-user", "nats-password-file", "nats-token-file", "nats-ca", "nats-cert", "nats-key"}
}

// Options resolves the flags, then the environment, into connection options for url. Every
// file named is opened here and a secret file read, so a missing or unreadable one is an error
// naming the flag or variable that gave it (and the path), never what it holds; all of them are
// joined. The worker's start, `worker check-config`, `worker setup` and submit share it.
func (n *NATS) Options(url, name string, getenv func(string) string) (queue.ConnOptions, error) {
	o := queue.ConnOptions{URL: url, Name: name}
	var errs []error
	for _, f := range []struct {
		s   setting
		dst *string
	}{
		{pick(n.creds, "nats-creds", Env.Creds, getenv), &o.CredsFile},
		{pick(n.nkey, "nats-nkey", Env.NKey, getenv), &o.NKeyFile},
		{pick(n.ca, "nats-ca", Env.CA, getenv), &o.CAFile},
		{pick(n.cert, "nats-cert", Env.Cert, getenv), &o.CertFile},
		{pick(n.key, "nats-key", Env.Key, getenv), &o.KeyFile},
	} {
		*f.dst = f.s.value
		if err := readable(f.s.value); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.s.from, err))
		}
	}
	o.User = pick(n.user, "nats-user", Env.User, getenv).value
	var err error
	if o.Password, err = secret(pick(n.passwordFile, "nats-password-file", Env.PasswordFile, getenv), Env.Password, getenv); err != nil {
		errs = append(errs, err)
	}
	if o.Token, err = secret(pick(n.tokenFile, "nats-token-file", Env.TokenFile, getenv), Env.Token, getenv); err != nil {
		errs = append(errs, err)
	}
	return o, errors.Join(errs...)
}

// setting is a value given by a flag, else by its environment variable, with the name of
// the one that gave it: an error says where to fix it.
type setting struct{ value, from string }

func pick(flag, flagName, env string, getenv func(string) string) setting {
	if flag != "" {
		return setting{flag, "--" + flagName}
	}
	return setting{getenv(env), env}
}

// readable checks that the file at path (none: nothing to check) can be opened for reading.
func readable(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}

// secret is the content of the file, else the value of env; surrounding white space is dropped.
func secret(file setting, env string, getenv func(string) string) (string, error) {
	if file.value == "" {
		return strings.TrimSpace(getenv(env)), nil
	}
	data, err := ReadSecretFile(file.value)
	if err != nil {
		return "", fmt.Errorf("%s: %w", file.from, err)
	}
	return data, nil
}

// maxSecretBytes bounds a password, token or seed file.
const maxSecretBytes = 64 << 10

// ReadSecretFile reads a small secret (a password, a token) from a file, without the white
// space around it. The error names the file only.
func ReadSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxSecretBytes {
		return "", fmt.Errorf("%s is larger than %d bytes; is it the right file?", path, maxSecretBytes)
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// EmbeddedTokenFile is where `worker --embedded` keeps the token of its NATS server, in its
// data dir ($BOXCAR_HOME), mode 0600.
const EmbeddedTokenFile = "nats.token"

// WithEmbeddedToken gives o the embedded worker's token from home when o has no login of its
// own and every server it names is on this machine: a local submit finds the local worker
// without a flag, and the token never travels to another host.
func WithEmbeddedToken(o queue.ConnOptions, home string) (queue.ConnOptions, error) {
	if o.Auth() != "none" || home == "" || !queue.LoopbackOnly(o.URL) {
		return o, nil
	}
	tok, err := ReadSecretFile(filepath.Join(home, EmbeddedTokenFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return o, nil
	case err != nil:
		return o, fmt.Errorf("the embedded worker's NATS token: %w", err)
	}
	o.Token = tok
	return o, nil
}
