package natsconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/boxcar-run/boxcar/internal/job"
)

// Identity is one login the generator makes: a role, for per-tenant roles its tenant.
type Identity struct {
	Role   Role
	Tenant string
}

// Name is the identity's user name and the stem of its .creds file: "worker", "operator",
// "<tenant>-submitter", "<tenant>-approver".
func (id Identity) Name() string {
	if id.Role.perTenant() {
		return id.Tenant + "-" + string(id.Role)
	}
	return string(id.Role)
}

// Identities are the logins of a deployment with these tenants: a submitter and an approver
// per tenant, one worker, one operator.
func Identities(tenants []string) []Identity {
	var ids []Identity
	for _, t := range tenants {
		ids = append(ids, Identity{Submitter, t}, Identity{Approver, t})
	}
	return append(ids, Identity{Role: Worker}, Identity{Role: Operator})
}

// TLS is the server's certificate, as paths the server reads (the generator does not).
type TLS struct {
	Cert, Key string
	// ClientCA, when set, makes the server require client certificates it signed (mTLS).
	ClientCA string
}

// Options say what to generate.
type Options struct {
	// Dir receives nats-server.conf and creds/<identity>.creds; it must not hold a previous
	// generation (a new one makes a new operator, which invalidates every old login).
	Dir     string
	Names   Names
	Tenants []string
	// Listen is the server's client address (host:port). Default: the server's, 0.0.0.0:4222.
	Listen string
	// StoreDir is JetStream's store directory. Default: the server's.
	StoreDir string
	// TLS, when set, makes the server speak TLS only.
	TLS *TLS
}

// Result names what Generate wrote.
type Result struct {
	ServerConfig string
	// Creds maps each identity's name to its .creds file.
	Creds map[string]string
	// Account is the public key of the account BOXCAR, where the streams are (the chart's
	// natsServer.account, for KEDA).
	Account string
}

// ServerConfigFile is the name of the server configuration in Options.Dir.
const ServerConfigFile = "nats-server.conf"

// Generate writes the server configuration and the .creds files: an operator and a system
// account (which JetStream in JWT mode needs), one account BOXCAR with JetStream holding every
// identity, each a user whose JWT carries its exact permissions (PermissionsOf). The operator
// and account seeds are not kept: to change a permission or add a tenant, generate again and
// replace the server's configuration and every .creds file.
func Generate(o Options) (Result, error) {
	if err := o.validate(); err != nil {
		return Result{}, err
	}
	okp, acct, sys, err := newKeys()
	if err != nil {
		return Result{}, err
	}
	res := Result{ServerConfig: filepath.Join(o.Dir, ServerConfigFile), Creds: map[string]string{}, Account: acct.pub}
	if err := os.MkdirAll(filepath.Join(o.Dir, "creds"), 0o700); err != nil {
		return Result{}, fmt.Errorf("nats-config: %w", err)
	}
	for _, id := range Identities(o.Tenants) {
		creds, err := userCreds(o.Names, id, o.Tenants, acct.kp)
		if err != nil {
			return Result{}, fmt.Errorf("nats-config: identity %s: %w", id.Name(), err)
		}
		path := filepath.Join(o.Dir, "creds", id.Name()+".creds")
		if err := writeNew(path, creds); err != nil {
			return Result{}, err
		}
		res.Creds[id.Name()] = path
	}
	conf, err := serverConfig(o, okp, acct, sys)
	if err != nil {
		return Result{}, err
	}
	return res, writeNew(res.ServerConfig, []byte(conf))
}

func (o Options) validate() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("nats-config: no output folder; give --out DIR"))
	}
	if len(o.Tenants) == 0 {
		errs = append(errs, errors.New("nats-config: no tenants"))
	}
	for _, t := range o.Tenants {
		if !job.ValidTenant(t) {
			errs = append(errs, fmt.Errorf("nats-config: tenant %q: a tenant is 1 to 32 of a-z, 0-9 and -, starting with a letter or digit", t))
		}
	}
	if o.TLS != nil && (o.TLS.Cert == "" || o.TLS.Key == "") {
		errs = append(errs, errors.New("nats-config: TLS needs the server's certificate and key (--tls-cert, --tls-key)"))
	}
	if o.Dir != "" {
		if _, err := os.Stat(filepath.Join(o.Dir, ServerConfigFile)); !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("nats-config: %s holds a generated configuration already; pick a new folder (a new generation replaces every login)", o.Dir))
		}
	}
	return errors.Join(errs...)
}

// account is a signed account: its key and its JWT.
type account struct {
	kp  nkeys.KeyPair
	pub string
	jwt string
}

// newKeys makes the operator, the BOXCAR account (JetStream unlimited) and the system account.
func newKeys() (nkeys.KeyPair, account, account, error) {
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, account{}, account{}, fmt.Errorf("nats-config: operator key: %w", err)
	}
	acct, err := newAccount(okp, "BOXCAR", true)
	if err != nil {
		return nil, account{}, account{}, err
	}
	sys, err := newAccount(okp, "SYS", false)
	return okp, acct, sys, err
}

func newAccount(okp nkeys.KeyPair, name string, jetStream bool) (account, error) {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return account{}, fmt.Errorf("nats-config: account %s key: %w", name, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return account{}, err
	}
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if jetStream {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	token, err := ac.Encode(okp)
	if err != nil {
		return account{}, fmt.Errorf("nats-config: sign account %s: %w", name, err)
	}
	return account{kp: kp, pub: pub, jwt: token}, nil
}

// userCreds makes the identity's user key, signs its JWT with the account and returns the
// .creds file's contents.
func userCreds(n Names, id Identity, tenants []string, acct nkeys.KeyPair) ([]byte, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	upub, err := ukp.PublicKey()
	if err != nil {
		return nil, err
	}
	p := PermissionsOf(n, id, tenants, upub)
	uc := jwt.NewUserClaims(upub)
	uc.Name = id.Name()
	uc.Pub.Allow = p.Pub
	uc.Sub.Allow = p.Sub
	if id.Tenant != "" {
		uc.Tags.Add("tenant:" + id.Tenant)
	}
	uc.Tags.Add("role:" + string(id.Role))
	token, err := uc.Encode(acct)
	if err != nil {
		return nil, err
	}
	seed, err := ukp.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, seed)
}

// serverConfig is nats-server.conf: JWT mode with a memory resolver preloaded with both
// accounts, JetStream, and the listen address and TLS when given.
func serverConfig(o Options, okp nkeys.KeyPair, acct, sys account) (string, error) {
	opub, err := okp.PublicKey()
	if err != nil {
		return "", err
	}
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "boxcar"
	oc.SystemAccount = sys.pub
	ojwt, err := oc.Encode(okp)
	if err != nil {
		return "", fmt.Errorf("nats-config: sign operator: %w", err)
	}
	var b strings.Builder
	b.WriteString("# Generated by `worker nats-config`: Boxcar's identities and their permissions\n")
	b.WriteString("# (docs/security.md). Generate again to change them; do not edit.\n")
	if o.Listen != "" {
		fmt.Fprintf(&b, "listen: %s\n", strconv.Quote(o.Listen))
	}
	if o.StoreDir != "" {
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n}\n", strconv.Quote(o.StoreDir))
	} else {
		b.WriteString("jetstream: enabled\n")
	}
	fmt.Fprintf(&b, "operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n", strconv.Quote(ojwt), strconv.Quote(sys.pub))
	fmt.Fprintf(&b, "  # BOXCAR: every identity of Boxcar\n  %s: %s\n", strconv.Quote(acct.pub), strconv.Quote(acct.jwt))
	fmt.Fprintf(&b, "  # SYS: the server's own account\n  %s: %s\n}\n", strconv.Quote(sys.pub), strconv.Quote(sys.jwt))
	if t := o.TLS; t != nil {
		fmt.Fprintf(&b, "tls {\n  cert_file: %s\n  key_file: %s\n", strconv.Quote(t.Cert), strconv.Quote(t.Key))
		if t.ClientCA != "" {
			fmt.Fprintf(&b, "  ca_file: %s\n  verify: true\n", strconv.Quote(t.ClientCA))
		}
		b.WriteString("}\n")
	}
	return b.String(), nil
}

// writeNew writes a file that must not exist yet, readable by its owner only.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("nats-config: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("nats-config: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("nats-config: write %s: %w", path, err)
	}
	return nil
}
