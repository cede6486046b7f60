package image

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestWriteReadsBack(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	helper := filepath.Join(dir, "helper")
	os.WriteFile(agent, []byte("agent bytes"), 0o600)
	os.WriteFile(helper, []byte("helper bytes"), 0o600)
	spec := Spec{
		Tag:   "localhost/sockmesh:test",
		Files: []File{{agent, "/usr/bin/sockmesh"}, {helper, "/usr/bin/helper"}},
	}
	out := filepath.Join(dir, "img.tar")
	if err := Write(out, spec); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(spec.Tag)
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform = %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/sockmesh"}) {
		t.Errorf("entrypoint = %q, want the first file", cf.Config.Entrypoint)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers = %d, %v; want exactly one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		entry := h.Name
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			entry += "=" + string(b)
			if h.Mode != 0o755 {
				t.Errorf("%s mode = %o, want 0755", h.Name, h.Mode)
			}
		}
		got = append(got, entry)
	}
	want := []string{"usr/", "usr/bin/", "usr/bin/sockmesh=agent bytes", "usr/bin/helper=helper bytes"}
	if !slices.Equal(got, want) {
		t.Errorf("layer = %q, want %q (parents before children)", got, want)
	}

	// The same inputs give the same digest: a rebuilt image with unchanged
	// binaries is the same image to the runtime.
	d1, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	out2 := filepath.Join(dir, "img2.tar")
	if err := Write(out2, spec); err != nil {
		t.Fatal(err)
	}
	img2, err := tarball.ImageFromPath(out2, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if d2, err := img2.Digest(); err != nil || d1 != d2 {
		t.Errorf("digests differ between identical builds: %s vs %s, %v", d1, d2, err)
	}
}

func TestWriteRejects(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	os.WriteFile(bin, []byte("x"), 0o600)
	for _, tc := range []struct {
		name, want string
		spec       Spec
	}{
		{"bad tag", "parse tag", Spec{Tag: "Not A Tag", Files: []File{{bin, "/bin"}}}},
		{"no files", "no files", Spec{Tag: "localhost/x:y"}},
		{"relative path", "not absolute", Spec{Tag: "localhost/x:y", Files: []File{{bin, "bin"}}}},
		{"missing host file", "read", Spec{Tag: "localhost/x:y", Files: []File{{filepath.Join(dir, "nope"), "/bin"}}}},
		{"duplicate", "given twice", Spec{Tag: "localhost/x:y", Files: []File{{bin, "/a/bin"}, {bin, "/a/bin"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out.tar")
			err := Write(out, tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Write = %v, want an error containing %q", err, tc.want)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed Write left %s behind", out)
			}
		})
	}
}

func TestParseFile(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want File
		ok   bool
	}{
		{"bin/sockmesh=/sockmesh", File{"bin/sockmesh", "/sockmesh"}, true},
		{"a=b=/c", File{"a", "b=/c"}, false},
		{"bin/sockmesh", File{}, false},
		{"=/x", File{}, false},
		{"x=relative", File{}, false},
	} {
		got, err := ParseFile(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseFile(%q) = %+v, %v; want %+v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
