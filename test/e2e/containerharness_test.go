//go:build integration

package e2e

// What only the container tests need beyond test/containers (the shared harness that builds
// and runs images with testcontainers-go): waiting for a container to answer HTTP, and the
// static versitygw that goes into the store's FROM scratch image.

import (
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"

	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/test/containers"
)

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
	containers.GoCommand(t, gobin, []string{"CGO_ENABLED=0", "GOBIN=" + gobin, "GOFLAGS=-mod=mod", "GOPROXY=" + localModuleProxy(t), "GOSUMDB=off"},
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
	out, err := exec.Command(containers.GoBinary(), "env", "GOMODCACHE").Output()
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
