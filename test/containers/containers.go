// Package containers is test support for running Boxcar's release image, and building and
// running any other container a test needs, with testcontainers-go: a Docker engine reached on this
// machine, images built from a local context without any registry, containers on the host's
// network with a read-only root and no capabilities. Nothing here pulls an image or starts
// testcontainers' Ryuk reaper (which would need a pull); every container and image is removed
// when the test that made it ends.
//
// The release image itself comes from `make image` (ReleaseImage); no test compiles anything.
// It is used by test/e2e and test/cluster; it is an ordinary package so that both (the second
// is a module of its own) can import it.
package containers

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

// dockerFix is the exact command that makes a Docker engine available on this machine; a
// container test without an engine fails with it instead of skipping, so a CI machine that
// lost its engine cannot pass by testing less.
const dockerFix = "run, as root, from the repository root:\n\tscripts/docker.sh\n" +
	"(it runs `apt-get install -y docker.io` when dockerd is missing and starts dockerd with --bridge=none --iptables=false --ip6tables=false; `make test` and `make test-cluster` run it)"

// mainModule is the module whose root holds the Dockerfile and the commands of the image.
const mainModule = "github.com/boxcar-run/boxcar"

// NewDocker returns a testcontainers Docker provider for the test, or fails the test naming
// the command that starts an engine.
//
// The provider treats the "host" network as the default one: the engine runs with
// --bridge=none, so there is no "bridge" network, and testcontainers would otherwise create a
// bridge network of its own and attach every container to it. Containers here use host
// networking only.
func NewDocker(t testing.TB) *testcontainers.DockerProvider {
	t.Helper()
	// Ryuk, testcontainers' reaper, runs from an image that would have to be pulled; the tests
	// remove what they start themselves. testcontainers reads this once per process, at its
	// first provider, so it is set before that.
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

// BuildImage builds the Dockerfile in contextDir through testcontainers, tagged
// repo:<random>, with the build arguments args, and removes the image when the test ends.
// FROM scratch images need no pull.
func BuildImage(t testing.TB, p *testcontainers.DockerProvider, contextDir, repo string, args map[string]string) string {
	t.Helper()
	buildArgs := map[string]*string{}
	for k, v := range args {
		buildArgs[k] = &v
	}
	var buildLog bytes.Buffer
	req := &testcontainers.ContainerRequest{FromDockerfile: testcontainers.FromDockerfile{
		Context:        contextDir,
		Dockerfile:     "Dockerfile",
		Repo:           repo,
		Tag:            RandomHex(6),
		BuildArgs:      buildArgs,
		BuildLogWriter: &buildLog,
		KeepImage:      true, // removed below, once, not by each container's Terminate
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

// Spec describes a container that Run starts on the host's network, read-only, without
// capabilities: the way the Helm chart runs the worker.
type Spec struct {
	Image string
	Cmd   []string
	Env   map[string]string
	// Binds are host:container[:ro] bind mounts.
	Binds []string
	// User overrides the image's USER ("uid:gid"); empty keeps it.
	User string
}

// Run creates and starts a container on the host network with a read-only root filesystem,
// every capability dropped, no new privileges and a small tmpfs on /tmp (what the chart mounts
// there), and removes it when the test ends.
func Run(t testing.TB, p *testcontainers.DockerProvider, spec Spec) *testcontainers.DockerContainer {
	t.Helper()
	req := testcontainers.ContainerRequest{
		Image: spec.Image,
		Cmd:   spec.Cmd,
		Env:   spec.Env,
		ConfigModifier: func(c *container.Config) {
			if spec.User != "" {
				c.User = spec.User
			}
		},
		HostConfigModifier: func(hc *container.HostConfig) {
			hc.NetworkMode = "host"
			hc.ReadonlyRootfs = true
			hc.CapDrop = []string{"ALL"}
			hc.SecurityOpt = []string{"no-new-privileges"}
			hc.Tmpfs = map[string]string{"/tmp": "rw,noexec,nosuid,size=64m,mode=1777"}
			hc.Binds = spec.Binds
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created, err := p.CreateContainer(ctx, req)
	if created != nil {
		t.Cleanup(func() {
			// Containers are always removed; the test reads logs and states before this runs.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := created.Terminate(ctx); err != nil {
				t.Errorf("remove container %s: %v", created.GetContainerID(), err)
			}
		})
	}
	if err != nil {
		t.Fatalf("create container from %s: %v", spec.Image, err)
	}
	c := created.(*testcontainers.DockerContainer)
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start container from %s: %v\n%s", spec.Image, err, Logs(t, c))
	}
	return c
}

// Logs returns what the container wrote to stdout and stderr so far.
func Logs(t testing.TB, c *testcontainers.DockerContainer) string {
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

// WaitExit waits until the container's main process has ended and returns its state.
func WaitExit(t testing.TB, c *testcontainers.DockerContainer, within time.Duration) *container.State {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := c.State(ctx)
		cancel()
		if err != nil {
			t.Fatalf("container state: %v", err)
		}
		if !st.Running && st.Status != container.StateCreated {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("container still %s after %s:\n%s", st.Status, within, Logs(t, c))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// imageRef is where `make image` records the image it built and the version stamped into it,
// relative to the repository's root.
const imageRef = "bin/image.ref"

// ReleaseImage returns the worker's release image that `make image` built from this checkout
// (`make test` and `make test-cluster` run it first) and the version stamped into it. The image
// is built there, once, not here: compiling the static binaries inside a test would put a
// compile under the test's time limit. A missing or removed image fails the test with the make
// command.
func ReleaseImage(t testing.TB, p *testcontainers.DockerProvider) (image, version string) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, imageRef))
	if err != nil {
		t.Fatalf("no release image recorded (%v); build it first, from %s:\n\tmake image", err, root)
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		t.Fatalf("%s holds %q, want \"IMAGE VERSION\"; rebuild it, from %s:\n\tmake image", imageRef, data, root)
	}
	image, version = fields[0], fields[1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Client().ImageInspect(ctx, image); err != nil {
		t.Fatalf("the release image %s that %s names is not in the Docker engine (%v); rebuild it, from %s:\n\tmake image", image, imageRef, err, root)
	}
	return image, version
}

// repoRoot is the repository's root: the nearest folder, from the working directory up, whose
// go.mod is the main module's (test/cluster has a go.mod of its own).
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if strings.TrimSpace(sc.Text()) == "module "+mainModule {
					f.Close()
					return dir, nil
				}
			}
			f.Close()
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod of module %s in %s or a folder above it", mainModule, wd)
		}
	}
}

// RandomHex returns n random bytes in hex: names and tags that do not collide between runs.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
