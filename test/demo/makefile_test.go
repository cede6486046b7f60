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
	sc := newSudoCheckout(t)
	if out, err := sc.make("demo").CombinedOutput(); err != nil {
		t.Fatalf("make demo: %v\n%s", err, out)
	}
	if n := sc.checkHandedBack(t); n < 3 { // bin/, sockmesh, sockmesh-demo
		t.Errorf("make demo wrote %d entries in bin/, want the directory and two binaries", n)
	}
	err := filepath.WalkDir(sc.home, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		checkOwner(t, path, sudoUID, sudoGID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The stand-in ran and found Go's directories: root's own.
	data, err := os.ReadFile(sc.cacheDirs)
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

// TestMakeBuildHandsBackWhenItFails: a build under sudo that fails, or
// that the user interrupts (Ctrl-C), hands bin/ back all the same, and
// make fails with the build's own status. The hand-back ran only after a
// build that succeeded: a compile error left bin/ root's, with the
// binaries that did link, and the user's next plain `make build` could
// not write it. The stand-in go writes one binary and then fails, or
// waits until the test interrupts make's process group as a terminal
// would.
func TestMakeBuildHandsBackWhenItFails(t *testing.T) {
	t.Run("fails", func(t *testing.T) {
		sc := newSudoCheckout(t)
		cmd := sc.make("build")
		cmd.Env = append(cmd.Env, "FAKE_GO_FAIL=3")
		out, err := cmd.CombinedOutput()
		// make reports the status its recipe failed with.
		if err == nil || !strings.Contains(string(out), "stand-in compile error") || !strings.Contains(string(out), "Error 3") {
			t.Errorf("make build: %v, want it to fail with the build's status 3\n%s", err, out)
		}
		if n := sc.checkHandedBack(t); n != 2 { // bin/, sockmesh
			t.Errorf("make build wrote %d entries in bin/, want the directory and the binary that linked", n)
		}
	})
	t.Run("interrupted", func(t *testing.T) {
		sc := newSudoCheckout(t)
		building := filepath.Join(t.TempDir(), "building")
		if err := syscall.Mkfifo(building, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := sc.make("build")
		cmd.Env = append(cmd.Env, "FAKE_GO_HANG="+building)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a process group of its own, as a terminal's job
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The stand-in opens the fifo once it wrote its binary; the open
		// here returns then.
		f, err := os.OpenFile(building, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err == nil {
			t.Errorf("make build, interrupted, succeeded\n%s", &out)
		}
		if n := sc.checkHandedBack(t); n != 2 {
			t.Errorf("make build wrote %d entries in bin/, want the directory and the binary written before the interrupt\n%s", n, &out)
		}
	})
}

// sudoUID and sudoGID are the user who ran sudo.
const sudoUID, sudoGID = 4242, 4243

// sudoCheckout is a checkout, and the home of the user who ran sudo, both
// theirs, in which make runs as root with a stand-in go.
type sudoCheckout struct {
	makefile, fakeGo, cacheDirs, home, checkout string
}

func newSudoCheckout(t *testing.T) *sudoCheckout {
	t.Helper()
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
	sc := &sudoCheckout{makefile: makefile, fakeGo: filepath.Join(dir, "go"), cacheDirs: filepath.Join(dir, "cache-dirs"),
		home: filepath.Join(dir, "home"), checkout: filepath.Join(dir, "checkout")}
	if err := os.WriteFile(sc.fakeGo, fmt.Appendf(nil, fakeGoScript, realGo, sc.cacheDirs), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{sc.home, sc.checkout} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, sudoUID, sudoGID); err != nil {
			t.Fatal(err)
		}
	}
	return sc
}

// make returns `make target` in the checkout as sudo -E runs it: as
// root, with the user's HOME and Go variables of their profile.
func (sc *sudoCheckout) make(target string) *exec.Cmd {
	cmd := exec.Command("make", "-f", sc.makefile, "-C", sc.checkout, target, "GO="+sc.fakeGo)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SUDO_UID=%d", sudoUID), fmt.Sprintf("SUDO_GID=%d", sudoGID), "HOME="+sc.home,
		"GOCACHE="+filepath.Join(sc.home, "gocache"), "GOMODCACHE="+filepath.Join(sc.home, "gomod"),
		"XDG_CONFIG_HOME="+filepath.Join(sc.home, ".config"))
	return cmd
}

// checkHandedBack checks that everything in the checkout's bin/ is the
// user's, and returns how many entries it holds, bin/ included.
func (sc *sudoCheckout) checkHandedBack(t *testing.T) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(filepath.Join(sc.checkout, "bin"), func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n++
		checkOwner(t, path, sudoUID, sudoGID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fakeGoScript stands for go (%[1]s: the real one, for go env): "build ...
// -o OUT" creates the directories Go keeps its build cache, module cache
// and telemetry in, appending their names to %[2]s, and writes OUT, a
// program that exits at once, or OUT/sockmesh when OUT ends in a slash.
// Then, with FAKE_GO_FAIL set, it fails with that status, as a build
// whose other packages did not compile; with FAKE_GO_HANG, it opens that
// fifo for writing and waits to be interrupted.
const fakeGoScript = `#!/bin/sh
if [ "$1" = env ]; then exec %[1]s "$@"; fi
for d in $(%[1]s env GOCACHE GOMODCACHE GOTELEMETRYDIR); do mkdir -p "$d" && echo "$d" >> %[2]s || exit 1; done
out= prev=
for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
case "$out" in */) mkdir -p "$out"; out="${out}sockmesh";; esac
printf '#!/bin/sh\nexit 0\n' > "$out" && chmod +x "$out" || exit 1
if [ -n "$FAKE_GO_FAIL" ]; then echo "stand-in compile error" >&2; exit "$FAKE_GO_FAIL"; fi
if [ -n "$FAKE_GO_HANG" ]; then : > "$FAKE_GO_HANG"; exec sleep 600; fi
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
