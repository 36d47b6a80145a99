package e2e

// The container tests' harness: a Docker engine reached through testcontainers-go, images built
// from a local context without any registry, containers on the host's network, and the static
// binaries that go into those images. Nothing here pulls an image or starts testcontainers'
// Ryuk reaper (which would need a pull); every container and image is removed in t.Cleanup.

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"

	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// dockerFix is the exact command that makes a Docker engine available on this machine; a
// container test without an engine fails with it instead of skipping, so a CI machine that
// lost its engine cannot pass by testing less.
const dockerFix = "run, as root, from the repository root:\n\tscripts/docker.sh\n" +
	"(it runs `apt-get install -y docker.io` when dockerd is missing and starts dockerd with --bridge=none --iptables=false --ip6tables=false; `make test` runs it)"

// repoRoot is the repository, seen from this package's folder.
const repoRoot = "../.."

// newDocker returns a testcontainers Docker provider for the test, or fails the test naming
// the command that starts an engine.
//
// The provider treats the "host" network as the default one: the engine runs with
// --bridge=none, so there is no "bridge" network, and testcontainers would otherwise create a
// bridge network of its own and attach every container to it. Containers here use host
// networking only.
func newDocker(t *testing.T) *testcontainers.DockerProvider {
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

// buildImage builds the Dockerfile in contextDir through testcontainers, tagged
// repo:<random>, and removes the image when the test ends. FROM scratch images need no pull.
func buildImage(t *testing.T, p *testcontainers.DockerProvider, contextDir, repo string, args map[string]string) string {
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
		Tag:            randomSuffix(6),
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

// hostContainer describes a container on the host's network, read-only, without capabilities.
type hostContainer struct {
	image string
	cmd   []string
	env   map[string]string
	// binds are host:container[:ro] bind mounts.
	binds []string
	// user overrides the image's USER ("uid:gid"); empty keeps it.
	user string
	// start: false only creates the container.
	start bool
}

// runContainer creates (and starts) a container on the host network with a read-only root
// filesystem, every capability dropped, no new privileges and a small tmpfs on /tmp (what the
// chart mounts there), and removes it when the test ends.
func runContainer(t *testing.T, p *testcontainers.DockerProvider, spec hostContainer) *testcontainers.DockerContainer {
	t.Helper()
	req := testcontainers.ContainerRequest{
		Image: spec.image,
		Cmd:   spec.cmd,
		Env:   spec.env,
		ConfigModifier: func(c *container.Config) {
			if spec.user != "" {
				c.User = spec.user
			}
		},
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
			// Containers are always removed; the test reads logs and states before this runs.
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
	if spec.start {
		if err := c.Start(ctx); err != nil {
			t.Fatalf("start container from %s: %v\n%s", spec.image, err, containerLogs(t, c))
		}
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

// waitExit waits until the container's main process has ended and returns its state.
func waitExit(t *testing.T, c *testcontainers.DockerContainer, within time.Duration) *container.State {
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
			t.Fatalf("container still %s after %s:\n%s", st.Status, within, containerLogs(t, c))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitHTTP polls url until it answers with want, for up to within; it returns the last body.
func waitHTTP(t *testing.T, url string, want int, within time.Duration, alive func() error) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(within)
	var last string
	for {
		resp, err := client.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
			if resp.StatusCode == want {
				return string(body)
			}
		} else {
			last = err.Error()
		}
		if alive != nil {
			if err := alive(); err != nil {
				t.Fatalf("waiting for %s to answer %d: %v", url, want, err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer %d within %s; last: %s", url, want, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// releaseBuildFlags are those of the Makefile's `image` target: trimmed paths, no symbol table or
// DWARF (smaller image; stack traces still work), the version stamped in. CGO_ENABLED=0 comes
// from the environment.
func releaseBuildFlags(version string) []string {
	return []string{"build", "-trimpath", "-buildvcs=auto", "-ldflags", "-s -w -X github.com/boxcar-run/boxcar/internal/provenance.releaseVersion=" + version}
}

// stageReleaseImage lays out the build context of the repository's Dockerfile the way
// `make image` does: the Dockerfile and .dockerignore, and under bin/image the static worker and
// submit, the host's CA bundle and the passwd and group files with user 65532. It returns the
// context folder.
func stageReleaseImage(t *testing.T, version string) string {
	t.Helper()
	const caBundle = "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(caBundle); err != nil {
		t.Fatalf("the image needs the host's CA bundle: %v; install it with: apt-get install -y ca-certificates", err)
	}
	dir := t.TempDir()
	stage := filepath.Join(dir, "bin", "image")
	if err := os.MkdirAll(stage, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Dockerfile", ".dockerignore"} {
		copyInto(t, filepath.Join(repoRoot, name), filepath.Join(dir, name))
	}
	copyInto(t, caBundle, filepath.Join(stage, "ca-certificates.crt"))
	writeText(t, filepath.Join(stage, "passwd"), "root:x:0:0:root:/root:/sbin/nologin\nboxcar:x:65532:65532:boxcar:/tmp:/sbin/nologin\n")
	writeText(t, filepath.Join(stage, "group"), "root:x:0:\nboxcar:x:65532:\n")

	start := time.Now()
	args := append(releaseBuildFlags(version), "-o", stage+"/", "./cmd/worker", "./cmd/submit")
	goCommand(t, repoRoot, []string{"CGO_ENABLED=0", "GOPROXY=off"}, args...)
	t.Logf("built static worker and submit in %s", time.Since(start).Round(time.Millisecond))
	return dir
}

// goCommand runs the go command in dir with extra environment, failing the test with its output.
func goCommand(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBinary(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// goBinary is the go command of the toolchain running the tests.
func goBinary() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); pathExists(p) {
		return p
	}
	return "go"
}

// checkStatic fails unless path is a statically linked ELF executable: a FROM scratch image has
// no dynamic loader or libc to run anything else.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (it has an ELF interpreter); build it with CGO_ENABLED=0", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v; build it with CGO_ENABLED=0", path, libs)
	}
	return nil
}

// staticVersitygw returns a statically linked versitygw of the version s3test expects: the
// go-installed one when it is static, else one go-installed with CGO_ENABLED=0 into the user's
// cache folder, where later runs find it (go install links versitygw against libc when a C
// compiler is around; the module comes from the cache the first install filled).
func staticVersitygw(t *testing.T) string {
	t.Helper()
	installed, err := s3test.Binary()
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/versity/versitygw"
	want := s3test.InstallCommand[strings.LastIndex(s3test.InstallCommand, "@")+1:]
	if err := checkVersitygw(installed, module, want); err != nil {
		t.Fatalf("%v; install it with:\n\t%s", err, s3test.InstallCommand)
	}
	err = checkStatic(installed)
	if err == nil {
		return installed
	}
	cache, cerr := os.UserCacheDir()
	if cerr != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "boxcar-e2e", "versitygw-"+want+"-static")
	bin := filepath.Join(dir, "versitygw")
	if checkVersitygw(bin, module, want) == nil && checkStatic(bin) == nil {
		return bin
	}
	t.Logf("the installed versitygw is not static (%v); building a static one into %s", err, dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Into a fresh folder first, then renamed: a concurrent run never sees half a binary.
	gobin, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(gobin)
	start := time.Now()
	// The module cache the first install filled serves as the proxy: a test never reaches
	// outside the machine.
	goCommand(t, gobin, []string{"CGO_ENABLED=0", "GOBIN=" + gobin, "GOFLAGS=-mod=mod", "GOPROXY=" + localModuleProxy(t), "GOSUMDB=off"},
		"install", "-trimpath", module+"/cmd/versitygw@"+want)
	if err := checkStatic(filepath.Join(gobin, "versitygw")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(gobin, "versitygw"), bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built a static versitygw %s in %s", want, time.Since(start).Round(time.Millisecond))
	return bin
}

// localModuleProxy is a GOPROXY that serves only what the module cache holds.
func localModuleProxy(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(goBinary(), "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	return "file://" + filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
}

// checkVersitygw checks that bin is versitygw built from module@version.
func checkVersitygw(bin, module, version string) error {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("read build info of %s: %w", bin, err)
	}
	if bi.Path != module+"/cmd/versitygw" || bi.Main.Version != version {
		return fmt.Errorf("%s is %s@%s, want %s/cmd/versitygw@%s", bin, bi.Path, bi.Main.Version, module, version)
	}
	return nil
}

func copyInto(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, fi.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

func writeText(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func pathExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func randomSuffix(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// errExited says a container stopped while the test waited for it to answer.
var errExited = errors.New("container exited")

// stillRunning returns a check for waitHTTP that fails once the container has stopped.
func stillRunning(c *testcontainers.DockerContainer) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := c.State(ctx)
		if err != nil {
			return err
		}
		if !st.Running {
			return fmt.Errorf("%w with code %d", errExited, st.ExitCode)
		}
		return nil
	}
}
