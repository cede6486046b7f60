package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

// TestMakeDemoUnderSudo: `sudo make demo`, the README's first command,
// leaves what its build wrote in the checkout, bin/, to the user who ran
// sudo, and writes nothing in their home, even when sudo keeps their HOME
// (`sudo -E`) and their environment names Go caches there. bin/ was root's,
// and the user's next `make build` could not write it; under `sudo -E` Go
// created ~/.cache/go-build and ~/go root's, and their next build could
// not write its caches. A stand-in go writes the binaries, as root would,
// and creates the directories the real go names for its caches, as a
// build does (the targets' environment and hand-back are what is tested,
// not the compiler); the demo it "builds" exits at once.
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
	fakeGo, cacheDirs := filepath.Join(dir, "go"), filepath.Join(dir, "cache-dirs")
	if err := os.WriteFile(fakeGo, fmt.Appendf(nil, fakeGoScript, realGo, cacheDirs), 0o755); err != nil {
		t.Fatal(err)
	}
	const uid, gid = 4242, 4243 // the user who ran sudo
	home, checkout := filepath.Join(dir, "home"), filepath.Join(dir, "checkout")
	for _, d := range []string{home, checkout} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
	}

	// sudo -E: the user's HOME, and Go variables of their profile.
	cmd := exec.Command("make", "-f", makefile, "-C", checkout, "demo", "GO="+fakeGo)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SUDO_UID=%d", uid), fmt.Sprintf("SUDO_GID=%d", gid), "HOME="+home,
		"GOCACHE="+filepath.Join(home, "gocache"), "GOMODCACHE="+filepath.Join(home, "gomod"), "XDG_CONFIG_HOME="+filepath.Join(home, ".config"))
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
	err = filepath.WalkDir(home, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		checkOwner(t, path, uid, gid)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The stand-in ran and found Go's directories: root's own.
	data, err := os.ReadFile(cacheDirs)
	if err != nil {
		t.Fatal(err)
	}
	dirs := strings.Fields(string(data))
	if len(dirs) == 0 {
		t.Fatal("the stand-in go found no cache directories")
	}
	for _, d := range dirs {
		checkOwner(t, d, 0, 0)
	}
}

// fakeGoScript stands for go (%[1]s: the real one, for go env): "build ...
// -o OUT" creates the directories Go keeps its build cache, module cache
// and telemetry in, appending their names to %[2]s, and writes OUT, a
// program that exits at once, or OUT/sockmesh when OUT ends in a slash.
const fakeGoScript = `#!/bin/sh
if [ "$1" = env ]; then exec %[1]s "$@"; fi
for d in $(%[1]s env GOCACHE GOMODCACHE GOTELEMETRYDIR); do mkdir -p "$d" && echo "$d" >> %[2]s || exit 1; done
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
