package cluster_test

// The release image's harness, short copies of test/e2e's (test packages cannot import each
// other's _test files): the build context staged as `make image` stages it, the image built
// through testcontainers-go without any registry (FROM scratch, Ryuk off), and containers on the
// host network with a read-only root and no capabilities. Every container and image is removed
// in t.Cleanup.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

// dockerFix is the command that makes a Docker engine available; without an engine the test
// fails with it and never skips.
const dockerFix = "run, as root, from the repository root:\n\tscripts/docker.sh\n" +
	"(`make test-cluster` runs it; it starts dockerd with --bridge=none --iptables=false --ip6tables=false)"

// newDocker returns a testcontainers Docker provider whose default network is the host's (the
// engine has no bridge), with Ryuk disabled (its image would have to be pulled).
func newDocker(t *testing.T) *testcontainers.DockerProvider {
	t.Helper()
	if err := os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true"); err != nil {
		t.Fatal(err)
	}
	p, err := testcontainers.NewDockerProvider(
		testcontainers.WithLogger(tclog.TestLogger(t)),
		testcontainers.WithDefaultBridgeNetwork("host"),
	)
	if err != nil {
		t.Fatalf("no Docker engine answers (testcontainers: %v); %s", err, dockerFix)
	}
	t.Cleanup(func() { _ = p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Health(ctx); err != nil {
		t.Fatalf("the Docker engine does not answer (%v); %s", err, dockerFix)
	}
	if !p.Config().RyukDisabled {
		t.Fatal("testcontainers read its configuration before TESTCONTAINERS_RYUK_DISABLED=true was set; Ryuk would need an image pull")
	}
	return p
}

// stageReleaseImage lays out the build context of the repository's Dockerfile as `make image`
// does (same build flags, version stamped in) and returns the context folder.
func stageReleaseImage(t *testing.T, version string) string {
	t.Helper()
	const repoRoot, caBundle = "../..", "/etc/ssl/certs/ca-certificates.crt"
	dir := t.TempDir()
	stage := filepath.Join(dir, "bin", "image")
	if err := os.MkdirAll(stage, 0o755); err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{
		filepath.Join(repoRoot, "Dockerfile"):    filepath.Join(dir, "Dockerfile"),
		filepath.Join(repoRoot, ".dockerignore"): filepath.Join(dir, ".dockerignore"),
		caBundle:                                 filepath.Join(stage, "ca-certificates.crt"),
	} {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatalf("stage the image: %v", err)
		}
		writeFile(t, to, string(data), 0o644)
	}
	writeFile(t, filepath.Join(stage, "passwd"), "root:x:0:0:root:/root:/sbin/nologin\nboxcar:x:65532:65532:boxcar:/tmp:/sbin/nologin\n", 0o644)
	writeFile(t, filepath.Join(stage, "group"), "root:x:0:\nboxcar:x:65532:\n", 0o644)

	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-buildvcs=auto",
		"-ldflags", "-s -w -X github.com/boxcar-run/boxcar/internal/provenance.releaseVersion="+version,
		"-o", stage+"/", "./cmd/worker", "./cmd/submit")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of the image's binaries: %v\n%s", err, out)
	}
	return dir
}

// buildImage builds the Dockerfile in contextDir as repo:<random> and removes the image when
// the test ends.
func buildImage(t *testing.T, p *testcontainers.DockerProvider, contextDir, repo string, args map[string]string) string {
	t.Helper()
	buildArgs := map[string]*string{}
	for k, v := range args {
		buildArgs[k] = &v
	}
	var buildLog bytes.Buffer
	req := &testcontainers.ContainerRequest{FromDockerfile: testcontainers.FromDockerfile{
		Context: contextDir, Dockerfile: "Dockerfile", Repo: repo, Tag: randomHex(6),
		BuildArgs: buildArgs, BuildLogWriter: &buildLog,
		KeepImage: true, // removed below, once
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag, err := p.BuildImage(ctx, req)
	if err != nil {
		t.Fatalf("build image %s from %s: %v\n%s", repo, contextDir, err, buildLog.String())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Client().ImageRemove(ctx, tag, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil {
			t.Errorf("remove image %s: %v", tag, err)
		}
	})
	return tag
}

// hostContainer is a container as the chart runs the worker: host network, read-only root,
// every capability dropped, no new privileges, a tmpfs on /tmp.
type hostContainer struct {
	image string
	cmd   []string
	env   map[string]string
	binds []string // host:container[:ro]
	user  string   // "uid:gid"
}

// runContainer creates and starts a hostContainer and removes it when the test ends.
func runContainer(t *testing.T, p *testcontainers.DockerProvider, spec hostContainer) *testcontainers.DockerContainer {
	t.Helper()
	req := testcontainers.ContainerRequest{
		Image: spec.image, Cmd: spec.cmd, Env: spec.env,
		ConfigModifier: func(c *container.Config) { c.User = spec.user },
		HostConfigModifier: func(hc *container.HostConfig) {
			hc.NetworkMode = "host"
			hc.ReadonlyRootfs = true
			hc.CapDrop = []string{"ALL"}
			hc.SecurityOpt = []string{"no-new-privileges"}
			hc.Tmpfs = map[string]string{"/tmp": "rw,noexec,nosuid,size=64m,mode=1777"}
			hc.Binds = spec.binds
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created, err := p.CreateContainer(ctx, req)
	if created != nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := created.Terminate(ctx); err != nil {
				t.Errorf("remove container %s: %v", created.GetContainerID(), err)
			}
		})
	}
	if err != nil {
		t.Fatalf("create container from %s: %v", spec.image, err)
	}
	c := created.(*testcontainers.DockerContainer)
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start container from %s: %v\n%s", spec.image, err, containerLogs(t, c))
	}
	return c
}

// containerLogs returns what the container wrote to stdout and stderr so far.
func containerLogs(t *testing.T, c *testcontainers.DockerContainer) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := c.Logs(ctx)
	if err != nil {
		return fmt.Sprintf("(no logs: %v)", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Sprintf("%s\n(reading logs: %v)", data, err)
	}
	return string(data)
}

// containerExited returns the container's state once its main process has ended.
func containerExited(t *testing.T, c *testcontainers.DockerContainer, within time.Duration) *container.State {
	t.Helper()
	var st *container.State
	eventually(t, within, "container "+c.GetContainerID()[:12]+" to exit", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if st, err = c.State(ctx); err != nil {
			return err
		}
		if st.Running || st.Status == container.StateCreated {
			return fmt.Errorf("still %s", st.Status)
		}
		return nil
	})
	return st
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
