package s3test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/boxcar-run/boxcar/internal/spawn"
)

// SeaweedVersion is the SeaweedFS module version scripts/install-seaweedfs.sh builds weed from.
const SeaweedVersion = "v0.0.0-20261109003541-7506e5f91cd6"

// SeaweedInstallCommand installs the weed this harness expects.
const SeaweedInstallCommand = "scripts/install-seaweedfs.sh"

// StartSeaweed runs a fresh SeaweedFS (`weed mini`: master, volume, filer and S3 gateway in one
// process, on loopback only) for the test, a second S3 implementation beside versitygw, and
// stops it in t.Cleanup. The test fails, naming the install command, when weed is missing.
func StartSeaweed(t testing.TB) *Server {
	t.Helper()
	bin, err := findBinary("weed")
	if err != nil {
		t.Fatalf("%v; install it with:\n\t%s", err, SeaweedInstallCommand)
	}
	dir := t.TempDir()
	s := &Server{AccessKey: "boxcar-test-" + randomHex(4), SecretKey: randomHex(20), Dir: filepath.Join(dir, "data"), t: t, seaweed: true}
	if err := os.Mkdir(s.Dir, 0o750); err != nil {
		t.Fatal(err)
	}
	conf, _ := json.Marshal(map[string]any{"identities": []any{map[string]any{
		"name":        "boxcar",
		"credentials": []any{map[string]string{"accessKey": s.AccessKey, "secretKey": s.SecretKey}},
		"actions":     []string{"Admin", "Read", "List", "Tagging", "Write"},
	}}})
	confPath := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(confPath, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	// weed's parts find each other on the ports they are given, so it cannot take port 0 and
	// report back: a port taken between freePort and weed's bind makes it exit, and another set
	// is tried.
	var lastErr error
	for attempt := range 3 {
		lastErr = s.startSeaweed(bin, confPath, filepath.Join(dir, fmt.Sprintf("weed-%d.log", attempt)))
		if lastErr == nil {
			s.cleanup(t)
			return s
		}
	}
	t.Fatalf("s3test: weed did not start: %v", lastErr)
	return nil
}

// freePort returns a loopback port nothing listens on right now; only weed needs this.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) startSeaweed(bin, confPath, logPath string) error {
	ports := make([]int, 9)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	cmd := exec.Command(bin, "mini",
		"-dir="+s.Dir, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port="+p(0), "-master.port.grpc="+p(1),
		"-volume.port="+p(2), "-volume.port.grpc="+p(3),
		"-filer.port="+p(4), "-filer.port.grpc="+p(5),
		"-s3.port="+p(6), "-s3.port.grpc="+p(7),
		// The admin server runs with its UI off, for its maintenance worker; every part with a
		// default port is given one or turned off, as two weeds on one default collide.
		"-admin.port.grpc="+p(8), "-admin.port.legacy=0", "-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.config="+confPath, "-webdav=false", "-admin.ui=false",
		// Each bucket is a collection that takes several volumes at once. Left to itself, mini
		// sizes volumes (up to 1 GiB) and their number by the disk's free space at its start,
		// and on a busy CI disk ran out of volumes after two buckets ("no free volumes left",
		// a 500 to every put). Small sparse volumes, a fixed number: enough for every test's
		// buckets, whatever the disk has free.
		"-master.volumeSizeLimitMB=64", "-volume.max=200")
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=")
	if err := spawn.Start(cmd); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited, s.logf = cmd, exited, logf
	s.ports = make([]string, len(ports))
	for i := range ports {
		s.ports[i] = net.JoinHostPort("127.0.0.1", p(i))
	}
	s.Endpoint = "http://" + net.JoinHostPort("127.0.0.1", p(6))
	if err := s.waitSeaweed(); err != nil {
		s.Stop()
		log, _ := os.ReadFile(logPath)
		return fmt.Errorf("%w\n%s", err, log)
	}
	return nil
}

// waitSeaweed waits until the gateway lists buckets with the test's credentials: the S3 port
// answers before the filer behind it is ready.
func (s *Server) waitSeaweed() error {
	client := s.client()
	deadline := time.Now().Add(2 * startTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var err error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = client.ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("weed exited: %v", s.cmd.ProcessState)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("weed's S3 gateway %s did not list buckets within %s (last error: %v)", s.Endpoint, 2*startTimeout, err)
		}
	}
}

// client talks to the server as its root user, without the test's environment.
func (s *Server) client() *s3.Client {
	return s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		HTTPClient:   &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
	})
}

// Pid is the server process's id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Ports returns the addresses the server was told to listen on: weed's parts, or versitygw's
// endpoint.
func (s *Server) Ports() []string {
	if s.ports == nil {
		return []string{strings.TrimPrefix(s.Endpoint, "http://")}
	}
	return s.ports
}
