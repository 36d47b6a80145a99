package s3test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// StartIAM is Start with versitygw's internal IAM: accounts besides the root user, each of
// which reaches only the buckets it owns (CreateUser, CreateOwnedBucket), as S3 IAM keeps
// tenants apart.
func StartIAM(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data, iam := filepath.Join(dir, "data"), filepath.Join(dir, "iam")
	for _, d := range []string{data, iam} {
		if err := os.Mkdir(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	return start(t, bin, &Server{AccessKey: "boxcar-test-" + randomHex(4), SecretKey: randomHex(20), Dir: data, t: t, iamDir: iam}, dir)
}

// CreateUser makes an account with the role "user" (no bucket of its own until one is given
// to it) and returns its secret key.
func (s *Server) CreateUser(t testing.TB, access string) (secret string) {
	t.Helper()
	secret = randomHex(20)
	s.admin(t, "create-user", "--access", access, "--secret", secret, "--role", "user")
	return secret
}

// CreateOwnedBucket makes a bucket owned by the account with the access key owner.
func (s *Server) CreateOwnedBucket(t testing.TB, owner, bucket string) {
	t.Helper()
	s.admin(t, "create-bucket", "--owner", owner, "--bucket", bucket)
}

// admin runs `versitygw admin` against the server as its root user, given by the environment
// so that the secret is not in the process list.
func (s *Server) admin(t testing.TB, args ...string) {
	t.Helper()
	cmd := exec.Command(s.cmd.Path, append([]string{"admin", "--endpoint-url", s.Endpoint}, args...)...)
	cmd.Env = append(os.Environ(), "ADMIN_ACCESS_KEY_ID="+s.AccessKey, "ADMIN_SECRET_ACCESS_KEY="+s.SecretKey, "ADMIN_REGION="+Region)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("s3test: versitygw admin %s: %v\n%s", args[0], err, out)
	}
}
