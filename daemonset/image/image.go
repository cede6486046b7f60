package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one file of the image: the host file at HostPath, stored at the
// absolute ImagePath with mode 0755 (every file an image of ours holds is a
// program).
type File struct {
	HostPath  string
	ImagePath string
}

// Spec describes an image.
type Spec struct {
	// Tag is the image reference, e.g. localhost/sockmesh:dev. Nodes without
	// a registry run it with imagePullPolicy: Never; the localhost/ prefix
	// keeps a runtime from ever trying docker.io. Required.
	Tag string
	// Files go into the single layer, in order. At least one is required.
	Files []File
	// Entrypoint is the image's entrypoint; zero means the first file's
	// ImagePath with no arguments.
	Entrypoint []string
	// Arch is the platform architecture recorded in the image config; zero
	// means the architecture this program runs on (containerd refuses to
	// unpack an image whose platform does not match the node's).
	Arch string
}

// ParseFile parses the HOSTPATH=/IMAGE/PATH form the imagebuild command takes.
func ParseFile(s string) (File, error) {
	host, dst, ok := strings.Cut(s, "=")
	if !ok || host == "" || !path.IsAbs(dst) {
		return File{}, fmt.Errorf("parse file %q: want HOSTPATH=/IMAGE/PATH", s)
	}
	return File{HostPath: host, ImagePath: dst}, nil
}

// Write writes the image spec describes to out as a docker-archive tarball.
// The tarball is written next to out and renamed into place, so a reader
// never sees a partial image. The same inputs give the same image digest.
func Write(out string, spec Spec) error {
	ref, err := name.NewTag(spec.Tag)
	if err != nil {
		return fmt.Errorf("parse tag %q: %w", spec.Tag, err)
	}
	if len(spec.Files) == 0 {
		return errors.New("write image: no files")
	}
	layerTar, err := layerOf(spec.Files)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("make layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	entrypoint := spec.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = []string{spec.Files[0].ImagePath}
	}
	arch := spec.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config = v1.Config{Entrypoint: entrypoint}
	// A fixed creation time keeps the digest reproducible.
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
	if err != nil {
		return fmt.Errorf("create %s: %w", out, err)
	}
	tmp.Close()
	if err := tarball.WriteToFile(tmp.Name(), ref, img); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("rename %s: %w", out, err)
	}
	return nil
}

// layerOf packs files into an uncompressed tar with their parent
// directories, all owned by root with a fixed modification time.
func layerOf(files []File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.ImagePath) {
			return nil, fmt.Errorf("file %s: image path %q is not absolute", f.HostPath, f.ImagePath)
		}
		dst := path.Clean(f.ImagePath)
		if seen[dst] {
			return nil, fmt.Errorf("file %s: image path %s given twice", f.HostPath, dst)
		}
		data, err := os.ReadFile(f.HostPath)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f.HostPath, err)
		}
		var dirs []string
		for d := path.Dir(dst); d != "/" && !seen[d]; d = path.Dir(d) {
			dirs = append(dirs, d)
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			seen[dirs[i]] = true
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(dirs[i], "/") + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, fmt.Errorf("tar dir %s: %w", dirs[i], err)
			}
		}
		seen[dst] = true
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("tar %s: %w", dst, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", dst, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close tar: %w", err)
	}
	return buf.Bytes(), nil
}
