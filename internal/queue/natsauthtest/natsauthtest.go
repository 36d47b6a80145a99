// Package natsauthtest starts the real nats-server in-process the ways NATS deployments secure
// it: users with passwords, a token, nkey users, operator/account JWTs with a .creds file, TLS
// with a private CA and client certificates (mTLS). Certificates, keys, seeds and creds are
// generated into the test's temp dir. Only tests use it.
package natsauthtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Certs are the paths of a private CA and of a server and a client certificate it signed, the
// server's for 127.0.0.1 and localhost.
type Certs struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	// OtherCA signed nothing here: a client that trusts only it must refuse the server.
	OtherCA string
}

// NewCerts generates Certs into a temp dir of t.
func NewCerts(t testing.TB) Certs {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCA(t, dir, "ca")
	other, _ := newCA(t, dir, "other-ca")
	c := Certs{CA: ca.path, OtherCA: other.path}
	c.ServerCert, c.ServerKey = leaf(t, dir, "server", ca.cert, caKey, x509.ExtKeyUsageServerAuth)
	c.ClientCert, c.ClientKey = leaf(t, dir, "client", ca.cert, caKey, x509.ExtKeyUsageClientAuth)
	return c
}

type caFile struct {
	cert *x509.Certificate
	path string
}

func newCA(t testing.TB, dir, name string) (caFile, *ecdsa.PrivateKey) {
	t.Helper()
	key := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "boxcar test " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der := must(x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key))
	cert := must(x509.ParseCertificate(der))
	path := filepath.Join(dir, name+".pem")
	write(t, path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return caFile{cert: cert, path: path}, key
}

func leaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (certPath, keyPath string) {
	t.Helper()
	key := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "boxcar test " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der := must(x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey))
	keyDER := must(x509.MarshalPKCS8PrivateKey(key))
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	write(t, certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	write(t, keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	return certPath, keyPath
}

// NKeyUser makes an nkey user: its public key for the server and a seed file for the client.
func NKeyUser(t testing.TB) (pub, seedFile string) {
	t.Helper()
	kp := must(nkeys.CreateUser())
	seed := must(kp.Seed())
	seedFile = filepath.Join(t.TempDir(), "user.nk")
	write(t, seedFile, seed)
	return must(kp.PublicKey()), seedFile
}

// Operator is an operator, one account with JetStream and one user of it, in JWT mode.
type Operator struct {
	claims               *jwt.OperatorClaims
	accountPub           string
	accountJWT           string
	systemPub, systemJWT string // the system account, which JetStream in JWT mode needs
	// CredsFile is the user's .creds file: its JWT and nkey seed.
	CredsFile string
	// Seed is the user's seed, for tests that look for it where it must not be.
	Seed string
	// UserPub is the user's public key.
	UserPub string
}

// NewOperator signs an operator, an account and a user, and writes the user's .creds file.
func NewOperator(t testing.TB) Operator {
	t.Helper()
	okp := must(nkeys.CreateOperator())
	opub := must(okp.PublicKey())
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "boxcar-test"
	ojwt := must(oc.Encode(okp))
	oclaims := must(jwt.DecodeOperatorClaims(ojwt))

	akp := must(nkeys.CreateAccount())
	apub := must(akp.PublicKey())
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "boxcar"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	ajwt := must(ac.Encode(okp))

	skp := must(nkeys.CreateAccount())
	spub := must(skp.PublicKey())
	sc := jwt.NewAccountClaims(spub)
	sc.Name = "SYS"
	sjwt := must(sc.Encode(okp))

	ukp := must(nkeys.CreateUser())
	upub := must(ukp.PublicKey())
	uc := jwt.NewUserClaims(upub)
	uc.Name = "worker"
	ujwt := must(uc.Encode(akp))
	seed := must(ukp.Seed())
	creds := must(jwt.FormatUserConfig(ujwt, seed))
	path := filepath.Join(t.TempDir(), "worker.creds")
	write(t, path, creds)
	return Operator{claims: oclaims, accountPub: apub, accountJWT: ajwt, systemPub: spub, systemJWT: sjwt, CredsFile: path, Seed: string(seed), UserPub: upub}
}

// Server says how to secure the server Start runs; the zero value is an open server.
type Server struct {
	Users map[string]string // user name -> password
	// Perms are the permissions of users of Users (name -> permissions); a user without an
	// entry may do anything.
	Perms    map[string]*server.Permissions
	Token    string
	NKeys    []string // public keys of nkey users
	Operator *Operator
	TLS      *Certs
	// VerifyClients requires a client certificate signed by the CA (mTLS).
	VerifyClients bool
	// JetStream with file storage in a temp dir.
	JetStream bool
}

// Start runs the server on 127.0.0.1 on a free port until the test ends, and returns it.
func Start(t testing.TB, s Server) *server.Server {
	t.Helper()
	opts := &server.Options{
		ServerName: "boxcar-authtest", Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		Authorization: s.Token,
	}
	for u, p := range s.Users {
		opts.Users = append(opts.Users, &server.User{Username: u, Password: p, Permissions: s.Perms[u]})
	}
	for _, pub := range s.NKeys {
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: pub})
	}
	if s.JetStream {
		opts.JetStream, opts.StoreDir = true, t.TempDir()
	}
	if op := s.Operator; op != nil {
		res := &server.MemAccResolver{}
		opts.TrustedOperators = []*jwt.OperatorClaims{op.claims}
		opts.AccountResolver = res
		if err := res.Store(op.accountPub, op.accountJWT); err != nil {
			t.Fatal(err)
		}
		if err := res.Store(op.systemPub, op.systemJWT); err != nil {
			t.Fatal(err)
		}
		opts.SystemAccount = op.systemPub
	}
	if s.TLS != nil {
		opts.TLSConfig = tlsConfig(t, *s.TLS, s.VerifyClients)
		opts.TLS, opts.TLSVerify, opts.TLSTimeout = true, s.VerifyClients, 5
	}
	return run(t, opts)
}

// StartFromConfig runs a server from a configuration file (what `worker nats-config` writes)
// until the test ends, and returns it.
func StartFromConfig(t testing.TB, file string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("nats-server cannot read %s: %v", file, err)
	}
	opts.NoSigs, opts.NoLog = true, true
	return run(t, opts)
}

// run starts a server with opts and stops it when the test ends.
func run(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

func tlsConfig(t testing.TB, c Certs, verify bool) *tls.Config {
	t.Helper()
	cert := must(tls.LoadX509KeyPair(c.ServerCert, c.ServerKey))
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if verify {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(must(os.ReadFile(c.CA)))
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg
}

func write(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// must returns v, and panics on err: generating keys and certificates in memory fails only on
// a broken machine, and the panic fails the test that asked with the stack that shows where.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
