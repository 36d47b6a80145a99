package natsconfig_test

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/natsconfig"
	"github.com/boxcar-run/boxcar/internal/queue/natsauthtest"
)

var names = natsconfig.NamesOf(config.Config{}.WithDefaults().NATS)

// TestGenerate writes a generation for two tenants, loads its server configuration the way
// nats-server does, and reads every identity's JWT back: its name, its tags and that its
// permissions are the table's, scoped to its tenant and its own inbox.
func TestGenerate(t *testing.T) {
	t.Parallel()
	dir, certs := t.TempDir(), natsauthtest.NewCerts(t)
	res, err := natsconfig.Generate(natsconfig.Options{
		Dir: dir, Names: names, Tenants: []string{"team-a", "team-b"}, Listen: "127.0.0.1:-1",
		StoreDir: filepath.Join(dir, "js"), TLS: &natsconfig.TLS{Cert: certs.ServerCert, Key: certs.ServerKey, ClientCA: certs.CA},
	})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(res.ServerConfig)
	if err != nil {
		t.Fatalf("nats-server cannot read the generated configuration: %v", err)
	}
	if len(opts.TrustedOperators) != 1 || opts.SystemAccount == "" || !opts.JetStream || opts.StoreDir != filepath.Join(dir, "js") {
		t.Errorf("server options: %d operators, system account %q, jetstream %v in %q; want 1, set, true in %s/js",
			len(opts.TrustedOperators), opts.SystemAccount, opts.JetStream, opts.StoreDir, dir)
	}
	if opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("server TLS: %+v; want client certificates required and verified (mTLS)", opts.TLSConfig)
	}
	checkAuthInclude(t, res.AuthConfig)
	want := []string{"team-a-submitter", "team-a-approver", "team-b-submitter", "team-b-approver", "worker", "operator"}
	if len(res.Creds) != len(want) {
		t.Errorf("%d creds files, want %d: %v", len(res.Creds), len(want), res.Creds)
	}
	for _, name := range want {
		uc := readCreds(t, res.Creds[name])
		if uc.Name != name {
			t.Errorf("%s: JWT names %q", name, uc.Name)
		}
		role, tenant := roleOf(name)
		p := natsconfig.PermissionsOf(names, natsconfig.Identity{Role: role, Tenant: tenant}, []string{"team-a", "team-b"}, uc.Subject)
		if !slices.Equal(uc.Pub.Allow, p.Pub) || !slices.Equal(uc.Sub.Allow, p.Sub) {
			t.Errorf("%s: permissions pub %v sub %v; want %v %v", name, uc.Pub.Allow, uc.Sub.Allow, p.Pub, p.Sub)
		}
		if tenant != "" && !uc.Tags.Contains("tenant:"+tenant) {
			t.Errorf("%s: tags %v lack tenant:%s", name, uc.Tags, tenant)
		}
	}
	if _, err := natsconfig.Generate(natsconfig.Options{Dir: dir, Names: names, Tenants: []string{"team-a"}}); err == nil {
		t.Error("a second generation into the same folder was accepted; it must be refused")
	}
}

// checkAuthInclude: the identities-only file, included by a server configuration made
// elsewhere (the NATS Helm chart's, with its own JetStream store), gives that server the
// operator and leaves its settings alone.
func checkAuthInclude(t *testing.T, auth string) {
	t.Helper()
	outer := filepath.Join(filepath.Dir(auth), "outer.conf")
	store := filepath.Join(t.TempDir(), "js")
	conf := fmt.Sprintf("port: -1\njetstream {store_dir: %q}\ninclude %s\n", store, filepath.Base(auth))
	if err := os.WriteFile(outer, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(outer)
	if err != nil {
		t.Fatalf("nats-server cannot include %s: %v", auth, err)
	}
	if len(opts.TrustedOperators) != 1 || opts.SystemAccount == "" || opts.StoreDir != store {
		t.Errorf("with %s included: %d operators, system account %q, store %q; want 1, set, the including file's %s",
			filepath.Base(auth), len(opts.TrustedOperators), opts.SystemAccount, opts.StoreDir, store)
	}
}

func roleOf(name string) (natsconfig.Role, string) {
	for _, r := range []natsconfig.Role{natsconfig.Submitter, natsconfig.Approver} {
		if t, ok := strings.CutSuffix(name, "-"+string(r)); ok {
			return r, t
		}
	}
	return natsconfig.Role(name), ""
}

func readCreds(t *testing.T, path string) *jwt.UserClaims {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
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
	return uc
}

// TestPermissionsScoped checks the table's scoping for each per-tenant identity: nothing it may
// publish or subscribe to names another tenant, no identity but the operator may create,
// update, delete or purge a stream or read a message by sequence, and a tenant's identities
// create no consumer at all (the server checks no consumer's deliver subject), nor look up a
// stream every tenant's keys are in (its info lists them: sharedInfo).
func TestPermissionsScoped(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		role   natsconfig.Role
		tenant string
		must   []string
		// never is what this role may not use, on top of what no role but the operator may.
		never []string
	}{
		{"submitter", natsconfig.Submitter, "team-a", []string{"boxcar.jobs.team-a.*", "$KV.BOXCAR_CANCEL.team-a.>", "$JS.API.DIRECT.GET.BOXCAR_JOBS.boxcar.jobs.team-a.*", "$JS.API.STREAM.INFO.BOXCAR_DLQ_team-a", "$JS.API.DIRECT.GET.BOXCAR_DLQ.BOXCAR_DLQ.team-a.>",
			"$JS.API.STREAM.INFO.KV_BOXCAR_USAGE_team-a", "$JS.API.DIRECT.GET.KV_BOXCAR_USAGE.$KV.BOXCAR_USAGE.team-a.>"}, noConsumers},
		{"approver", natsconfig.Approver, "team-a", []string{"$KV.BOXCAR_APPROVALS_team-a.team-a.>", "$KV.BOXCAR_APPROVALS.team-a.>"}, noConsumers},
		{"worker", natsconfig.Worker, "", []string{"$KV.BOXCAR_STATUS_team-a.>", "$KV.BOXCAR_USAGE_team-a.>", "$KV.BOXCAR_USAGE.>", "$JS.ACK.BOXCAR_JOBS.boxcar-workers-team-a.>", "$JS.API.CONSUMER.CREATE.KV_BOXCAR_CANCEL.*.$KV.BOXCAR_CANCEL.>"}, workerWatchesNoMore},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := natsconfig.PermissionsOf(names, natsconfig.Identity{Role: c.role, Tenant: c.tenant}, []string{"team-a"}, "UKEY")
			for _, s := range c.must {
				if !slices.Contains(p.Pub, s) {
					t.Errorf("may not publish %s: %v", s, p.Pub)
				}
			}
			for _, s := range sharedInfo {
				if c.tenant != "" && slices.Contains(p.Pub, s) {
					t.Errorf("may look up %s, which lists every tenant's keys", s)
				}
			}
			for _, s := range append(p.Pub, p.Sub...) {
				for _, bad := range append([]string{"team-b", "STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE", "MSG.GET", "CONSUMER.CREATE.BOXCAR_JOBS", "DURABLE", "_INBOX.>"}, c.never...) {
					if strings.Contains(s, bad) {
						t.Errorf("may use %s", s)
					}
				}
			}
		})
	}
}

// workerWatchesNoMore is the buckets the worker reads by key only: a consumer grant there
// would be one no code of it uses.
var workerWatchesNoMore = []string{"CONSUMER.CREATE.KV_BOXCAR_STATUS", "CONSUMER.CREATE.KV_BOXCAR_USAGE", "CONSUMER.CREATE.KV_BOXCAR_PROFILES", "$JS.FC.KV_BOXCAR_STATUS", "$JS.FC.KV_BOXCAR_USAGE"}

// sharedInfo is the info of the streams every tenant's keys are in, which a tenant's identity
// may not ask for: with a subject filter, it lists them (docs/security.md says which remain).
var sharedInfo = []string{"$JS.API.STREAM.INFO.BOXCAR_JOBS", "$JS.API.STREAM.INFO.KV_BOXCAR_STATUS", "$JS.API.STREAM.INFO.BOXCAR_DLQ", "$JS.API.STREAM.INFO.KV_BOXCAR_APPROVALS", "$JS.API.STREAM.INFO.KV_BOXCAR_USAGE"}

// noConsumers is what a tenant's identity may not use: creating, deleting or driving a
// consumer. A consumer's deliver subject is checked against no permission (nats-server issue
// #8274), so one a tenant creates could deliver into another tenant's job consumer.
var noConsumers = []string{"$JS.API.CONSUMER.CREATE", "$JS.API.CONSUMER.DELETE", "$JS.API.CONSUMER.DURABLE", "$JS.FC.", "$JS.API.CONSUMER.MSG.NEXT"}

// TestEveryIdentityConnectsWithManyTenants: a user's JWT carries its permissions, and the
// worker's grow with every tenant; the server reads it in the client's CONNECT line, which at
// nats-server's default max_control_line (4096) refused the worker of three tenants
// ("maximum control line exceeded"). The generated configuration takes the longest, also where
// another server's configuration includes it (the NATS chart's).
func TestEveryIdentityConnectsWithManyTenants(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var tenants []string
	for i := range 12 {
		tenants = append(tenants, fmt.Sprintf("tenant-%02d", i))
	}
	res, err := natsconfig.Generate(natsconfig.Options{Dir: dir, Names: names, Tenants: tenants, Listen: "127.0.0.1:-1", StoreDir: filepath.Join(dir, "js")})
	if err != nil {
		t.Fatal(err)
	}
	ns := natsauthtest.StartFromConfig(t, res.ServerConfig)
	for _, name := range []string{"worker", "operator", "tenant-11-submitter", "tenant-11-approver"} {
		nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(res.Creds[name]))
		if err != nil {
			t.Errorf("%s connects: %v", name, err)
			continue
		}
		nc.Close()
	}
	outer := filepath.Join(dir, "outer.conf")
	if err := os.WriteFile(outer, []byte("port: -1\ninclude "+natsconfig.AuthConfigFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(outer)
	if err != nil {
		t.Fatal(err)
	}
	worker, err := os.ReadFile(res.Creds["worker"])
	if err != nil {
		t.Fatal(err)
	}
	if int(opts.MaxControlLine) <= len(worker) {
		t.Errorf("with %s included, max_control_line is %d, shorter than the worker's credentials (%d bytes)", natsconfig.AuthConfigFile, opts.MaxControlLine, len(worker))
	}
}
