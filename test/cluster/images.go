package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// file is one entry of an image layer.
type file struct {
	name  string // path inside the image, without a leading slash
	mode  int64
	data  []byte
	link  string // symlink target
	isDir bool
}

// importImages writes the pause and sandbox images as docker-archive tarballs and imports
// them: no registry can be reached here, and pods use the images as they are on the node.
func (c *Cluster) importImages(ctx context.Context) error {
	pause, err := os.ReadFile(filepath.Join(c.cfg.HelperDir, "pause"))
	if err != nil {
		return fmt.Errorf("cluster: pause image: %w", err)
	}
	sandbox, err := busyboxFiles()
	if err != nil {
		return err
	}
	images := []struct {
		ref   string
		cmd   []string
		files []file
	}{
		{PauseImage, []string{"/pause"}, []file{{name: "pause", mode: 0o755, data: pause}}},
		{SandboxImage, []string{"/bin/sh"}, sandbox},
	}
	for _, img := range images {
		archive := c.path("images", strings.NewReplacer("/", "_", ":", "_").Replace(img.ref)+".tar")
		if err := writeDockerArchive(archive, img.ref, nil, img.cmd, img.files); err != nil {
			return err
		}
		if out, err := c.ctr(ctx, "images", "import", archive); err != nil {
			return fmt.Errorf("cluster: ctr images import %s: %w: %s", archive, err, out)
		}
	}
	return nil
}

// busyboxFiles is a root filesystem of busybox-static and its applets as symlinks, readable
// and runnable by any user: sandbox pods run as uid 1000.
func busyboxFiles() ([]file, error) {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, fmt.Errorf("cluster: sandbox image needs busybox-static: apt-get install -y busybox-static: %w", err)
	}
	out, err := exec.Command("/bin/busybox", "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("cluster: busybox --list-full: %w", err)
	}
	files := []file{
		{name: "bin", mode: 0o755, isDir: true},
		{name: "sbin", mode: 0o755, isDir: true},
		{name: "usr", mode: 0o755, isDir: true},
		{name: "usr/bin", mode: 0o755, isDir: true},
		{name: "usr/sbin", mode: 0o755, isDir: true},
		{name: "etc", mode: 0o755, isDir: true},
		{name: "tmp", mode: 0o1777, isDir: true},
		{name: "proc", mode: 0o555, isDir: true},
		{name: "sys", mode: 0o555, isDir: true},
		{name: "dev", mode: 0o755, isDir: true},
		{name: "bin/busybox", mode: 0o755, data: bb},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/work:/bin/sh\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nsandbox:x:1000:\n")},
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "bin/busybox" {
			continue
		}
		files = append(files, file{name: applet, mode: 0o777, link: "/bin/busybox"})
	}
	return files, nil
}

// writeDockerArchive writes the `docker save` format: one layer, its config and a manifest.
func writeDockerArchive(path, ref string, entrypoint, cmd []string, files []file) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case f.isDir:
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("cluster: image %s: %w", ref, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("cluster: image %s: %w", ref, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("cluster: image %s: %w", ref, err)
	}
	sum := sha256.Sum256(layer.Bytes())
	diffID := hex.EncodeToString(sum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Env":        []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
			"Entrypoint": entrypoint,
			"Cmd":        cmd,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
	})
	if err != nil {
		return fmt.Errorf("cluster: image %s config: %w", ref, err)
	}
	cfgSum := sha256.Sum256(config)
	cfgName := hex.EncodeToString(cfgSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config": cfgName, "RepoTags": []string{ref}, "Layers": []string{diffID + "/layer.tar"},
	}})
	if err != nil {
		return fmt.Errorf("cluster: image %s manifest: %w", ref, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("cluster: image folder: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cluster: image %s: %w", ref, err)
	}
	defer f.Close()
	out := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{diffID + "/layer.tar", layer.Bytes()}, {cfgName, config}, {"manifest.json", manifest}} {
		if err := out.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}); err != nil {
			return fmt.Errorf("cluster: image %s: %w", ref, err)
		}
		if _, err := io.Copy(out, bytes.NewReader(e.data)); err != nil {
			return fmt.Errorf("cluster: image %s: %w", ref, err)
		}
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("cluster: image %s: %w", ref, err)
	}
	return f.Close()
}

// ImportImage makes an image of static programs, bins mapping a path in the image to a
// program on the host, with cmd as its command and a writable /tmp, and imports it into the
// node's containerd: tests run their own servers as pods without a registry. Like a release
// image, it has an entrypoint, so a pod's args are the program's arguments.
func (h *Handle) ImportImage(ctx context.Context, ref string, bins map[string]string, entrypoint []string) error {
	// Folders first, parents before children (sorted names do that), then the programs.
	var dirs, files []file
	seen := map[string]bool{}
	for name, src := range bins {
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("cluster: image %s: %w", ref, err)
		}
		name = strings.TrimPrefix(name, "/")
		for d := filepath.Dir(name); d != "." && !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
			dirs = append(dirs, file{name: d, mode: 0o755, isDir: true})
		}
		files = append(files, file{name: name, mode: 0o755, data: data})
	}
	slices.SortFunc(dirs, func(a, b file) int { return strings.Compare(a.name, b.name) })
	files = append(append([]file{{name: "tmp", mode: 0o1777, isDir: true}}, dirs...), files...)
	dir, err := os.MkdirTemp("", "boxcar-cluster-image-")
	if err != nil {
		return fmt.Errorf("cluster: image %s: %w", ref, err)
	}
	defer os.RemoveAll(dir)
	archive := filepath.Join(dir, "image.tar")
	if err := writeDockerArchive(archive, ref, entrypoint, nil, files); err != nil {
		return err
	}
	return h.ImportArchive(ctx, archive)
}

// ImportArchive imports a `docker save` archive (docker save -o FILE IMAGE) into the node's
// containerd, under the names the archive gives its images: a pod with imagePullPolicy Never
// or IfNotPresent then runs it as if pulled.
func (h *Handle) ImportArchive(ctx context.Context, archive string) error {
	out, err := exec.CommandContext(ctx, "/usr/bin/ctr", "--address", h.Containerd, "--namespace", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cluster: ctr images import %s: %w: %s", archive, err, out)
	}
	return nil
}

// ImportBusyboxImage makes an image of the sandbox image's busybox with more of the host's
// files in it, and imports it: files maps a path in the image to a file on the host (kept
// with its mode), links a path to a symlink target. Tests whose commands need more than
// busybox (curl, Python) run in it.
func (h *Handle) ImportBusyboxImage(ctx context.Context, ref string, files, links map[string]string) error {
	base, err := busyboxFiles()
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, f := range base {
		seen[f.name] = true
	}
	var dirs, extra []file
	addDirs := func(name string) {
		for d := filepath.Dir(name); d != "." && !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
			dirs = append(dirs, file{name: d, mode: 0o755, isDir: true})
		}
	}
	for name, src := range files {
		name = strings.TrimPrefix(name, "/")
		st, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("cluster: image %s: %w", ref, err)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("cluster: image %s: %w", ref, err)
		}
		addDirs(name)
		extra = append(extra, file{name: name, mode: int64(st.Mode().Perm()), data: data})
	}
	for name, target := range links {
		name = strings.TrimPrefix(name, "/")
		addDirs(name)
		extra = append(extra, file{name: name, link: target})
	}
	// A busybox applet of the same name gives way to the host's program.
	base = slices.DeleteFunc(base, func(f file) bool { _, ok := files["/"+f.name]; return ok && f.link != "" })
	slices.SortFunc(dirs, func(a, b file) int { return strings.Compare(a.name, b.name) })
	dir, err := os.MkdirTemp("", "boxcar-cluster-image-")
	if err != nil {
		return fmt.Errorf("cluster: image %s: %w", ref, err)
	}
	defer os.RemoveAll(dir)
	archive := filepath.Join(dir, "image.tar")
	if err := writeDockerArchive(archive, ref, nil, []string{"/bin/sh"}, append(append(base, dirs...), extra...)); err != nil {
		return err
	}
	return h.ImportArchive(ctx, archive)
}
