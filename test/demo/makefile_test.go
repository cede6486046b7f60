package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TestMakeDemoUnderSudo: `sudo make demo`, the README's first command,
// leaves what its build wrote, bin/ and the files root added to a Go cache
// of the user's, to the user who ran sudo; root's own cache stays root's.
// bin/ was root's, and the user's next `make build` could not write it.
// A stand-in go writes the binaries, as root would (the targets' hand-back
// is what is tested, not the compiler); the demo it "builds" exits at once.
func TestMakeDemoUnderSudo(t *testing.T) {
	testenv.RequireRoot(t)
	makefile, err := filepath.Abs("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fakeGo := filepath.Join(dir, "go")
	if err := os.WriteFile(fakeGo, fmt.Appendf(nil, fakeGoScript, realGo), 0o755); err != nil {
		t.Fatal(err)
	}
	const uid, gid = 4242, 4243 // the user who ran sudo
	userCache, rootCache := filepath.Join(dir, "user-cache"), filepath.Join(dir, "root-cache")
	for _, cache := range []string{userCache, rootCache} {
		if err := os.Mkdir(cache, 0o755); err != nil {
			t.Fatal(err)
		}
		// Written by root during the build.
		if err := os.WriteFile(filepath.Join(cache, "entry"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(userCache, uid, gid); err != nil {
		t.Fatal(err)
	}
	checkout := filepath.Join(dir, "checkout")
	if err := os.Mkdir(checkout, 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("make", "-f", makefile, "-C", checkout, "demo", "GO="+fakeGo)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SUDO_UID=%d", uid), fmt.Sprintf("SUDO_GID=%d", gid),
		"GOCACHE="+userCache, "GOMODCACHE="+rootCache)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make demo: %v\n%s", err, out)
	}

	n := 0
	err = filepath.WalkDir(filepath.Join(checkout, "bin"), func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n++
		checkOwner(t, path, uid, gid)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 3 { // bin/, sockmesh, sockmesh-demo
		t.Errorf("make demo wrote %d entries in bin/, want the directory and two binaries", n)
	}
	checkOwner(t, filepath.Join(userCache, "entry"), uid, gid)
	checkOwner(t, filepath.Join(rootCache, "entry"), 0, 0)
}

// fakeGoScript stands for go (%s: the real one, for go env): "build ...
// -o OUT" writes OUT, a program that exits at once, or OUT/sockmesh when
// OUT ends in a slash.
const fakeGoScript = `#!/bin/sh
if [ "$1" = env ]; then exec %s "$@"; fi
out= prev=
for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
case "$out" in */) mkdir -p "$out"; out="${out}sockmesh";; esac
printf '#!/bin/sh\nexit 0\n' > "$out" && chmod +x "$out"
`

func checkOwner(t *testing.T, path string, uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != uid || st.Gid != gid {
		t.Errorf("%s is owned by %d:%d, want %d:%d", path, st.Uid, st.Gid, uid, gid)
	}
}
