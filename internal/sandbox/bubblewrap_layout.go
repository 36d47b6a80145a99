package sandbox

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// hostLayout mirrors the host's program folders read-only, keeping symlinks as symlinks (on a
// merged-/usr system /bin is a link to usr/bin), and only the few /etc entries that dynamically
// linked programs need. passwd, group and the like are synthesised per sandbox instead.
func hostLayout() []string {
	var args []string
	for _, dir := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(dir)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(dir); err == nil {
				args = append(args, "--symlink", target, dir)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", dir, dir)
		}
	}
	for _, name := range []string{"/etc/ld.so.cache", "/etc/alternatives"} {
		if _, err := os.Stat(name); err == nil {
			args = append(args, "--ro-bind", name, name)
		}
	}
	return args
}

// etcFiles are synthesised so that programs that look up users or hosts work, without showing
// the host's own accounts.
func etcFiles(workdir string) []etcFile {
	return []etcFile{
		{"/etc/passwd", fmt.Sprintf("root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nagent:x:%d:%d:agent:%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", sandboxUID, sandboxGID, workdir)},
		{"/etc/group", fmt.Sprintf("root:x:0:\nagent:x:%d:\nnogroup:x:65534:\n", sandboxGID)},
		{"/etc/hosts", "127.0.0.1\tlocalhost " + hostname + "\n::1\tlocalhost\n"},
		{"/etc/nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files\n"},
	}
}

type etcFile struct{ name, content string }

// reservedDirs are where the sandbox's own mounts go; a workdir there would hide them.
var reservedDirs = []string{"/proc", "/dev", "/tmp", "/run", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

func checkWorkdir(dir string) error {
	if !path.IsAbs(dir) || dir == "/" {
		return fmt.Errorf("sandbox: start: workdir %q must be an absolute path other than /, such as /work", dir)
	}
	for _, r := range reservedDirs {
		if dir == r || strings.HasPrefix(dir, r+"/") {
			return fmt.Errorf("sandbox: start: workdir %q lies in %s, which the sandbox mounts itself; use a folder such as /work", dir, r)
		}
	}
	return nil
}

// imageLayout mounts a rootfs folder read-only. Each top-level entry is bound on its own onto
// bwrap's fresh root rather than the folder as a whole, so that the workdir, /proc, /dev and
// /tmp can be made as mount points without writing into the image.
func imageLayout(image, workdir string) ([]string, error) {
	if !filepath.IsAbs(image) {
		return nil, fmt.Errorf("sandbox: start: image %q: name a rootfs folder by its absolute path (the bubblewrap backend takes a folder, not a container image)", image)
	}
	entries, err := os.ReadDir(image)
	if err != nil {
		return nil, fmt.Errorf("sandbox: start: image %q is not a readable rootfs folder (the bubblewrap backend takes a folder, not a container image): %w", image, err)
	}
	top := "/" + strings.SplitN(strings.TrimPrefix(workdir, "/"), "/", 2)[0]
	var args []string
	for _, e := range entries {
		dest := "/" + e.Name()
		switch dest {
		case "/proc", "/dev", "/tmp", "/run", "/sys": // /run holds the egress folder
			continue
		case top:
			if top != workdir {
				return nil, fmt.Errorf("sandbox: start: workdir %q would be made inside the read-only image folder %s; use a top-level workdir such as /work", workdir, dest)
			}
		}
		src := filepath.Join(image, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			target, err := os.Readlink(src)
			if err != nil {
				return nil, fmt.Errorf("sandbox: start: image %q: %w", image, err)
			}
			args = append(args, "--symlink", target, dest)
			continue
		}
		args = append(args, "--ro-bind", src, dest)
	}
	return args, nil
}

var unsafeID = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

func safeID(jobID string) string {
	id := strings.Trim(unsafeID.ReplaceAllString(jobID, "-"), "-.")
	if len(id) > 40 {
		id = id[:40]
	}
	if id == "" {
		id = "job"
	}
	return id
}
