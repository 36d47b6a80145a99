package sandbox

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/boxcar-run/boxcar/internal/sandbox/bridge"
)

var _ Egress = (*bubblewrapSandbox)(nil)

// egressSuffix names the host folder beside a sandbox's workdir that holds the proxy's socket
// and CA. It is made when the sandbox starts, so that egress can be attached to a sandbox
// started before its job was known, and bound read-only at egressMount in each Exec once it
// is attached: before that a sandbox's mounts are what they were without egress.
const egressSuffix = ".egress"

// networkIsolation is what the manifest's isolation says once egress is attached.
const networkIsolation = "network=loopback+egress(" + EgressAddr + " bridged to the worker's proxy socket)"

// AttachEgress puts the proxy's socket and CA in the sandbox's egress folder. From the next
// Exec on, the egress bridge (package bridge) runs in front of each command.
func (s *bubblewrapSandbox) AttachEgress(ctx context.Context, caPEM []byte) (net.Listener, error) {
	id, err := s.begin(nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox: attach egress: %w", err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: attach egress: %w", err)
	}
	if err := s.p.loadBridge(s.image != ""); err != nil {
		return nil, err
	}
	s.egressMu.Lock()
	defer s.egressMu.Unlock()
	if s.egressOn.Load() {
		return nil, errors.New("sandbox: attach egress: already attached; a sandbox has one proxy")
	}
	if s.bridge, err = holdBridge(s.p.bridgeBin, s.p.bridgeCopy); err != nil {
		return nil, err
	}
	owner := s.uid // -1: the worker's own
	if err := writeOwned(filepath.Join(s.egressDir, "ca.pem"), caPEM, 0o644, owner); err != nil {
		return nil, fmt.Errorf("sandbox: attach egress: write the CA: %w", err)
	}
	ln, err := listenOwned(ctx, s.egressDir, "proxy.sock", owner)
	if err != nil {
		return nil, fmt.Errorf("sandbox: attach egress: %w", err)
	}
	s.info.Isolation = strings.Replace(s.info.Isolation, "network=none", networkIsolation, 1)
	s.egressOn.Store(true)
	s.log.Info("egress attached")
	s.renewSpare() // the first command needs the egress binds
	return ln, nil
}

func writeOwned(name string, data []byte, mode os.FileMode, owner int) error {
	if err := os.WriteFile(name, data, mode); err != nil {
		return err
	}
	if owner >= 0 {
		return os.Chown(name, owner, owner)
	}
	return nil
}

// listenOwned listens on a unix socket dir/name that only owner (the sandbox's uid) may
// connect to. It binds through /proc/self/fd, so a long Root cannot push the path past the
// 108 bytes a socket address holds.
func listenOwned(ctx context.Context, dir, name string, owner int) (net.Listener, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	short := "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + name
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", short)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", filepath.Join(dir, name), err)
	}
	// The folder goes with the sandbox; the short path stops meaning anything once d closes.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	full := filepath.Join(dir, name)
	err = os.Chmod(full, 0o600)
	if err == nil && owner >= 0 {
		err = os.Chown(full, owner, owner)
	}
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("give %s to the sandbox: %w", full, err)
	}
	return ln, nil
}

// loadBridge names the copy of the bridge binary each sandbox with egress holds (holdBridge),
// once: bwrap binds it by path as the sandbox's uid, which cannot enter the folder the worker
// (or a test binary) may live in. It is linked, or else copied, into Root (searchable by
// others) under its digest, so workers of one version share it and no version replaces
// another's. In a rootfs image the host's libraries are absent, so there the binary must be
// static.
func (p *BubblewrapProvider) loadBridge(image bool) error {
	p.bridgeOnce.Do(func() {
		p.bridgeCopy, p.bridgeErr = bridgeName(p.bridgeBin, p.root)
		if f, err := elf.Open(p.bridgeBin); err == nil {
			for _, prog := range f.Progs {
				p.bridgeDynamic = p.bridgeDynamic || prog.Type == elf.PT_INTERP
			}
			f.Close()
		}
	})
	if p.bridgeErr != nil {
		return p.bridgeErr
	}
	if image && p.bridgeDynamic {
		return fmt.Errorf("sandbox: attach egress: the egress bridge %s is linked dynamically, and a rootfs image may lack its libraries; build the worker with CGO_ENABLED=0 (as make build does)", p.bridgeBin)
	}
	return nil
}

// bridgeName is the path of bin's copy in root: named by its digest.
func bridgeName(bin, root string) (string, error) {
	src, err := os.Open(bin)
	if err != nil {
		return "", fmt.Errorf("sandbox: egress bridge: %w", err)
	}
	defer src.Close()
	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", fmt.Errorf("sandbox: egress bridge: read %s: %w", bin, err)
	}
	return filepath.Join(root, bridgePrefix+hex.EncodeToString(h.Sum(nil))[:16]), nil
}

// placeBridge puts bin at dst unless a copy is there.
func placeBridge(bin, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	src, err := os.Open(bin)
	if err != nil {
		return fmt.Errorf("sandbox: egress bridge: %w", err)
	}
	defer src.Close()
	tmp := dst + "." + randomHex(4)
	if err := os.Link(bin, tmp); err != nil {
		if err := copyExecutable(src, tmp); err != nil {
			return fmt.Errorf("sandbox: egress bridge: copy %s into %s: %w", bin, filepath.Dir(dst), err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("sandbox: egress bridge: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("sandbox: egress bridge: %w", err)
	}
	return nil
}

func copyExecutable(src *os.File, dst string) error {
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}

// bridgeArgv is argv run behind the egress bridge.
func bridgeArgv(argv []string) []string {
	return append([]string{bridge.Path, bridge.Arg}, argv...)
}
