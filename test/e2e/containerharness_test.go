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
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"

	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/test/harness"
)

// waitHTTP polls url until it answers with want, for up to within; it returns the last body.
func waitHTTP(t *testing.T, url string, want int, within time.Duration, alive func() error) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	var last string
	harness.Wait(t, fmt.Sprintf("%s answers %d", url, want), func() (bool, error) {
		var state string
		if resp, err := client.Get(url); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				last = string(body)
				return true, nil
			}
			state = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			state = err.Error()
		}
		if alive != nil {
			if err := alive(); err != nil {
				t.Fatalf("waiting for %s to answer %d: %v", url, want, err)
			}
		}
		return false, errors.New(state)
	}, harness.Within(within))
	return last
}

// readyAddrs waits for a worker's --ready-file at path (in a folder mounted into its
// container) and returns the addresses in it: readiness is the file, never a log line.
func readyAddrs(t *testing.T, path string, alive func() error) harness.Addrs {
	t.Helper()
	a, err := harness.WaitReadyFile(t.Context(), harness.DefaultTimeout, "the worker container", path, alive)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// writableDir is a temp folder the image's user (65532) can write, for a bind mount.
func writableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
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

// staticVersitygw returns the installed versitygw, of the version s3test expects, which must be
// statically linked to run in a FROM scratch image. scripts/install-versitygw.sh (`make
// deps-test`) installs it so, once per version; a test never compiles it.
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
	if err := checkStatic(installed); err != nil {
		t.Fatalf("%v; reinstall it with:\n\t%s", err, s3test.InstallCommand)
	}
	return installed
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
