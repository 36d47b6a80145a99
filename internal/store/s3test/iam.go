package s3test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
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

// ChangeSecret gives the account access a new secret key and returns it: a worker still
// signing with the old one is answered SignatureDoesNotMatch.
func (s *Server) ChangeSecret(t testing.TB, access string) (secret string) {
	t.Helper()
	secret = randomHex(20)
	s.admin(t, "update-user", "--access", access, "--secret", secret)
	return secret
}

// DeleteUser removes the account access: a worker still signing as it is answered that no
// such access key exists.
func (s *Server) DeleteUser(t testing.TB, access string) {
	t.Helper()
	s.admin(t, "delete-user", "--access", access)
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

// UserVars are Vars for the account access, whose secret CreateUser returned.
func (s *Server) UserVars(access, secret string) map[string]string {
	vars := s.Vars()
	vars["AWS_ACCESS_KEY_ID"], vars["AWS_SECRET_ACCESS_KEY"] = access, secret
	return vars
}

// DenyWritesUnder gives bucket a policy that refuses the account access every write under
// prefix (PutObject, which multipart uploads are authorized by, as AWS S3 does) and lets it do
// anything else in the bucket: the IAM of an operator that scopes a worker's writes by prefix,
// as an S3 bucket policy does. The policy is set as the root user.
func (s *Server) DenyWritesUnder(t testing.TB, bucket, access, prefix string) {
	t.Helper()
	s.Deny(t, bucket, access, "s3:PutObject", prefix+"*")
}

// Deny gives bucket a policy that refuses the account access action on the keys resource
// matches (a key, or a pattern with "*") and lets it do anything else in the bucket: one
// Deny statement of an S3 bucket policy. The policy is set as the root user, and replaces any.
func (s *Server) Deny(t testing.TB, bucket, access, action, resource string) {
	t.Helper()
	policy := fmt.Sprintf(`{"Version":"2012-10-17","Statement":[
{"Effect":"Allow","Principal":{"AWS":[%[1]q]},"Action":["s3:*"],"Resource":["arn:aws:s3:::%[2]s","arn:aws:s3:::%[2]s/*"]},
{"Effect":"Deny","Principal":{"AWS":[%[1]q]},"Action":[%[4]q],"Resource":["arn:aws:s3:::%[2]s/%[3]s"]}]}`, access, bucket, resource, action)
	if _, err := s.client().PutBucketPolicy(t.Context(), &s3.PutBucketPolicyInput{Bucket: &bucket, Policy: &policy}); err != nil {
		t.Fatalf("s3test: put the policy of bucket %s: %v", bucket, err)
	}
}
