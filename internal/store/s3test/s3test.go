// Package s3test runs a real S3 server for tests: a versitygw process with its posix backend
// in a temporary directory, on a loopback port it binds itself and the harness reads back. It
// owns nothing else; tests of any package that talks S3 can use it.
package s3test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"go/build"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/boxcar-run/boxcar/internal/spawn"
	"github.com/boxcar-run/boxcar/internal/testnet"
)

// init keeps every test binary that starts an S3 server here off the instance metadata
// address (169.254.169.254): a test that forgot its credentials (Env, Vars) would have the AWS
// SDK look for them there, and tests send no packet beyond loopback. The SDK reads this from the
// process's environment whatever a store's own Getenv says.
func init() { _ = os.Setenv("AWS_EC2_METADATA_DISABLED", "true") }

// InstallCommand installs the versitygw this harness expects.
const InstallCommand = "CGO_ENABLED=0 GOFLAGS=-mod=mod go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// Region is the region the server signs for.
const Region = "us-east-1"

// startTimeout bounds how long a server may take to answer its health check.
const startTimeout = 30 * time.Second

// Server is one running versitygw.
type Server struct {
	// Endpoint is the server's base URL, http://127.0.0.1:<port>.
	Endpoint string
	// AccessKey and SecretKey are the root user's credentials.
	AccessKey string
	SecretKey string
	// Dir is the posix backend's root; each folder in it is a bucket.
	Dir string

	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has been waited for
	logf    *os.File
	t       testing.TB
	seaweed bool     // a SeaweedFS server, whose buckets are made through its S3 API
	iamDir  string   // with StartIAM: versitygw's internal IAM keeps its accounts here
	ports   []string // a SeaweedFS server's: the addresses its parts were given
}

// Binary returns the path of versitygw: from PATH, else from GOBIN or a GOPATH's bin folder,
// as the environment or `go env` sets them.
func Binary() (string, error) {
	p, err := findBinary("versitygw")
	if err != nil {
		return "", fmt.Errorf("%w; install it with:\n\t%s\n(or run scripts/install-versitygw.sh)", err, InstallCommand)
	}
	return p, nil
}

// findBinary looks for name on PATH, else in GOBIN or a GOPATH's bin folder.
func findBinary(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	var candidates []string
	if gobin := os.Getenv("GOBIN"); gobin != "" {
		candidates = append(candidates, filepath.Join(gobin, name))
	}
	gopaths := filepath.SplitList(build.Default.GOPATH)
	// `go env` also knows settings written with `go env -w`.
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(lines) == 2 {
			if lines[0] != "" {
				candidates = append(candidates, filepath.Join(lines[0], name))
			}
			gopaths = append(gopaths, filepath.SplitList(lines[1])...)
		}
	}
	for _, gopath := range gopaths {
		candidates = append(candidates, filepath.Join(gopath, "bin", name))
	}
	var checked []string
	for _, c := range candidates {
		if slices.Contains(checked, c) {
			continue
		}
		checked = append(checked, c)
		if info, err := os.Stat(c); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("%s is not on PATH nor in %v", name, checked)
}

// Start runs a fresh versitygw for the test and stops it in t.Cleanup. The test fails, naming
// the install command, when versitygw is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o750); err != nil {
		t.Fatal(err)
	}
	return start(t, bin, &Server{AccessKey: "boxcar-test-" + randomHex(4), SecretKey: randomHex(20), Dir: data, t: t}, dir)
}

func start(t testing.TB, bin string, s *Server, dir string) *Server {
	t.Helper()
	// versitygw binds port 0 and the port the kernel chose is read back.
	if err := s.startOn(bin, filepath.Join(dir, "versitygw.log"), "127.0.0.1:0"); err != nil {
		t.Fatalf("s3test: versitygw did not start: %v", err)
	}
	s.cleanup(t)
	return s
}

// cleanup stops the server when the test ends, and shows its log when the test failed.
func (s *Server) cleanup(t testing.TB) {
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			s.dumpLog()
		}
	})
}

// Restart starts a stopped server again on the same address and data, as an operator
// restarts one; the test fails if it cannot.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	addr := strings.TrimPrefix(s.Endpoint, "http://")
	if err := s.startOn(s.cmd.Path, s.logf.Name()+".restarted", addr); err != nil {
		t.Fatalf("s3test: restart versitygw on %s: %v", addr, err)
	}
}

func (s *Server) startOn(bin, logPath, addr string) error {
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	args := []string{
		"--access", s.AccessKey,
		"--secret", s.SecretKey,
		"--region", Region,
		"--port", addr,
		"--health", "/health",
		"--keep-alive",
		"--quiet",
	}
	if s.iamDir != "" {
		args = append(args, "--iam-dir", s.iamDir)
	}
	cmd := exec.Command(bin, append(args, "posix", s.Dir)...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Keep credentials for the root user out of the child's inherited environment.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID=", "ROOT_SECRET_ACCESS_KEY=")
	if err := spawn.Start(cmd); err != nil { // never outlives the test binary
		logf.Close()
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited, s.logf = cmd, exited, logf
	s.Endpoint = ""
	if !strings.HasSuffix(addr, ":0") {
		s.Endpoint = "http://" + addr
	}
	if err := s.waitReady(); err != nil {
		s.Stop()
		log, _ := os.ReadFile(logPath)
		return fmt.Errorf("%w\n%s", err, log)
	}
	return nil
}

// waitReady reads back the address the process bound when it was given port 0, then polls the
// health endpoint until it answers 200, the process exits or time runs out.
func (s *Server) waitReady() error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var err error
		if s.Endpoint == "" {
			var addr string
			if addr, err = testnet.ListeningAddr(s.cmd.Process.Pid); addr != "" {
				s.Endpoint = "http://" + addr
			} else if err == nil {
				err = errors.New("not listening yet")
			}
		}
		if s.Endpoint != "" {
			var resp *http.Response
			if resp, err = client.Get(s.Endpoint + "/health"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("versitygw exited: %v", s.cmd.ProcessState)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("versitygw did not answer %s/health within %s (last error: %v)", s.Endpoint, startTimeout, err)
		}
	}
}

// Stop ends the server and waits for it; the port is closed when Stop returns. Stopping
// twice is fine.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	s.logf.Close()
}

func (s *Server) dumpLog() {
	if s.logf == nil {
		return
	}
	if log, err := os.ReadFile(s.logf.Name()); err == nil && len(log) > 0 {
		s.t.Logf("%s log:\n%s", filepath.Base(s.cmd.Path), log)
	}
}

// CreateBucket makes a new, empty bucket with a unique name and returns the name. The posix
// backend's bucket is a folder, so this needs no client.
func (s *Server) CreateBucket(t testing.TB) string {
	t.Helper()
	name := "boxcar-" + randomHex(6)
	if s.seaweed {
		if _, err := s.client().CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: &name}); err != nil {
			t.Fatalf("s3test: create bucket: %v", err)
		}
		return name
	}
	if err := os.Mkdir(filepath.Join(s.Dir, name), 0o750); err != nil {
		t.Fatalf("s3test: create bucket: %v", err)
	}
	return name
}

// Env sets the AWS SDK's environment for this server's root user for the rest of the test,
// and keeps the SDK away from the machine's shared config files and instance metadata.
func (s *Server) Env(t testing.TB) {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", s.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s.SecretKey)
	t.Setenv("AWS_REGION", Region)
	IsolateEnv(t)
}

// Vars are the AWS SDK's settings for this server, for a command given its environment
// (workercmd's and submitcmd's getenv, store.Options.Getenv): its credentials and region, and
// no shared config files, profile or instance metadata. Unlike Env, they leave the process's
// environment alone, so tests that use them can run in parallel.
func (s *Server) Vars() map[string]string {
	return map[string]string{
		"AWS_ACCESS_KEY_ID": s.AccessKey, "AWS_SECRET_ACCESS_KEY": s.SecretKey, "AWS_REGION": Region,
		"AWS_EC2_METADATA_DISABLED": "true",
	}
}

// IsolateEnv keeps the AWS SDK away from the machine's shared config files, profiles and
// instance metadata for the rest of the test.
func IsolateEnv(t testing.TB) {
	t.Helper()
	none := filepath.Join(t.TempDir(), "none")
	t.Setenv("AWS_CONFIG_FILE", none)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", none)
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
