package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/boxcar-run/boxcar/internal/redact"
)

// ConnOptions say how to reach NATS and who to be there: every client of Boxcar (the worker,
// submit, tests) connects through them, by Connect or Dial. At most one of CredsFile,
// NKeyFile, User and Token is set; the URL may carry a user and password or a token too, as
// nats.go allows, but never reaches a log line or an error: see RedactURL.
type ConnOptions struct {
	// URL of the server(s), comma separated. Default: nats://127.0.0.1:4222.
	URL string
	// Name names the connection in the server's monitoring (boxcar-worker ID, boxcar-submit).
	Name string
	// CredsFile is a .creds file: a user JWT and its nkey seed (operator/account JWT mode).
	CredsFile string
	// NKeyFile holds an nkey seed (SU...); the server knows the user by its public key.
	NKeyFile string
	// User and Password log in with a user of the server's authorization block.
	User, Password string
	// Token is the server's authorization token.
	Token string
	// CAFile is a PEM bundle of the CAs that sign the server's certificate; setting it
	// requires TLS. Default: the system's roots (SSL_CERT_FILE).
	CAFile string
	// CertFile and KeyFile are the client certificate and its key (PEM), for servers that
	// verify clients (mTLS). Both or neither.
	CertFile, KeyFile string
	// Timeout bounds one dial. Default: 5s; a ctx deadline given to Connect bounds it too.
	Timeout time.Duration
	// Unreachable is what Connect's error tells to check when no server answers, in the words
	// of the command that connects. Default: a submitter's (--nats, NATS_URL, `worker --embedded`).
	Unreachable string
}

// LogValue shows the options without a secret: the URL redacted, files by name and only
// whether a password or token is set.
func (o ConnOptions) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("url", RedactURL(o.URL))}
	add := func(k, v string) {
		if v != "" {
			attrs = append(attrs, slog.String(k, v))
		}
	}
	add("creds_file", o.CredsFile)
	add("nkey_file", o.NKeyFile)
	add("user", o.User)
	add("ca_file", o.CAFile)
	add("cert_file", o.CertFile)
	if o.Token != "" {
		attrs = append(attrs, slog.Bool("token", true))
	}
	return slog.GroupValue(attrs...)
}

// Auth names how the options log in, for log lines and /readyz: "creds", "nkey", "user",
// "token", "url" (userinfo in the URL) or "none".
func (o ConnOptions) Auth() string {
	switch {
	case o.CredsFile != "":
		return "creds"
	case o.NKeyFile != "":
		return "nkey"
	case o.User != "":
		return "user"
	case o.Token != "":
		return "token"
	case redact.HasUser(o.URL):
		return "url"
	}
	return "none"
}

// validate checks what can be checked without a server: one way to log in, a certificate
// with its key, URLs that parse, files that can be read. Errors name the file or the URL's
// place in the list, never what it holds.
func (o ConnOptions) validate() error {
	var ways []string
	for _, w := range []struct{ name, v string }{
		{"a creds file", o.CredsFile}, {"an nkey seed file", o.NKeyFile}, {"a user", o.User}, {"a token", o.Token},
	} {
		if w.v != "" {
			ways = append(ways, w.name)
		}
	}
	switch {
	case len(ways) > 1:
		return fmt.Errorf("queue: NATS login: %s are given; give one", strings.Join(ways, " and "))
	case o.Password != "" && o.User == "":
		return errors.New("queue: NATS login: a password without a user; set the user too (--nats-user, NATS_USER)")
	case (o.CertFile == "") != (o.KeyFile == ""):
		return errors.New("queue: NATS client certificate: give both the certificate and its key (--nats-cert and --nats-key)")
	}
	// nats.go's error for a URL it cannot parse quotes the whole URL, password and all.
	if err := redact.CheckURLList(o.URL, "nats"); err != nil {
		return fmt.Errorf("queue: NATS URL: %w (check --nats, NATS_URL or nats.url in the config)", err)
	}
	for _, f := range []struct{ what, path string }{
		{"creds file", o.CredsFile}, {"nkey seed file", o.NKeyFile}, {"CA file", o.CAFile},
		{"client certificate", o.CertFile}, {"client key", o.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("queue: NATS %s: %w", f.what, err)
		}
	}
	return nil
}

// Check checks what Connect and Dial would before dialling: one way to log in, a certificate
// with its key, URLs that parse, files that can be read, a creds or seed file that holds what
// its kind does. Errors name the file or the URL's place in the list, never what it holds.
// `worker check-config` runs it to say what a starting worker would.
func (o ConnOptions) Check() error {
	if err := o.validate(); err != nil {
		return err
	}
	_, err := o.inboxPrefix()
	return err
}

// natsOptions turns the options into nats.go's, after the common ones of every Boxcar client.
func (o ConnOptions) natsOptions() ([]nats.Option, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	opts := []nats.Option{nats.Name(o.Name), nats.MaxReconnects(-1), nats.Timeout(timeout)}
	switch {
	case o.CredsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	case o.NKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(o.NKeyFile)
		if err != nil {
			// nats.go's error names the file's problem, not the seed.
			return nil, fmt.Errorf("queue: NATS nkey seed file %s: %w", o.NKeyFile, err)
		}
		opts = append(opts, opt)
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	case o.Token != "":
		opts = append(opts, nats.Token(o.Token))
	}
	if prefix, err := o.inboxPrefix(); err != nil {
		return nil, err
	} else if prefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(prefix))
	}
	if o.CAFile != "" {
		opts = append(opts, nats.RootCAs(o.CAFile))
	}
	if o.CertFile != "" {
		opts = append(opts, nats.ClientCert(o.CertFile, o.KeyFile))
	}
	return opts, nil
}

// inboxPrefix is _INBOX.<the user's public key> for a creds or nkey login: an identity that
// `worker nats-config` made may subscribe to its own inbox only, so no other identity can read
// the replies it gets (job bodies, statuses). Other logins keep nats.go's _INBOX.
func (o ConnOptions) inboxPrefix() (string, error) {
	file := o.CredsFile
	if file == "" {
		file = o.NKeyFile
	}
	if file == "" {
		return "", nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("queue: NATS login: %w", err)
	}
	if o.CredsFile != "" {
		// nats.go sends a creds file without a decorated JWT whole as the JWT: a seed file
		// given as the creds file would put the seed on the wire, which it must never leave.
		if raw, err := nkeys.ParseDecoratedJWT(data); err != nil || !isUserJWT(raw) {
			return "", fmt.Errorf("queue: NATS login: creds file %s holds no user JWT; a .creds file is what `nsc generate creds` or `worker nats-config` writes (for a bare nkey seed file use --nats-nkey, NATS_NKEY)", file)
		}
	}
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		// nkeys' errors say what is wrong with the file, never what it holds.
		return "", fmt.Errorf("queue: NATS login: %s holds no user seed: %w", file, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("queue: NATS login: %s: %w", file, err)
	}
	return "_INBOX." + pub, nil
}

// isUserJWT reports whether raw decodes as a user JWT; it never echoes raw, which may be anything
// the file held.
func isUserJWT(raw string) bool {
	_, err := jwt.DecodeUserClaims(raw)
	return err == nil
}

// Connect dials NATS once and fails when no server answers: for clients that should say so at
// once (submit). Reconnects after a loss are on.
func Connect(ctx context.Context, o ConnOptions) (*nats.Conn, error) {
	if dl, ok := ctx.Deadline(); ok && (o.Timeout <= 0 || time.Until(dl) < o.Timeout) {
		o.Timeout = time.Until(dl)
	}
	opts, err := o.natsOptions()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(o.URL, append(opts, nats.ReconnectWait(time.Second))...)
	if err != nil {
		hint := o.Unreachable
		if hint == "" {
			hint = "is a worker or nats-server running? start one with `worker --embedded`, or set --nats / NATS_URL and the credentials: see docs/security.md"
		}
		return nil, fmt.Errorf("queue: connect to NATS at %s: %w (%s)", RedactURL(o.URL), err, hint)
	}
	return nc, nil
}

// RedactURL returns the NATS URL list with the user information of each URL (a user and
// password, or a token) replaced by "redacted": what logs, /readyz and errors show. See
// redact.URL for a URL that does not parse.
func RedactURL(urls string) string {
	return redact.URLList(urls)
}

// LoopbackOnly reports whether every server the URL list names is on this machine (localhost,
// 127.0.0.0/8, ::1). An empty list means nats.go's default, 127.0.0.1:4222.
func LoopbackOnly(urls string) bool {
	if strings.TrimSpace(urls) == "" {
		return true
	}
	for _, p := range strings.Split(urls, ",") {
		s := strings.TrimSpace(p)
		if !strings.Contains(s, "://") {
			s = "nats://" + s
		}
		u, err := url.Parse(s)
		if err != nil || !IsLoopbackHost(u.Hostname()) {
			return false
		}
	}
	return true
}

// IsLoopbackHost reports whether host is "localhost" or a loopback address.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
