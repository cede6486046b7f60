package leakcheck

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestInDirs(t *testing.T) {
	stack := "goroutine 7 [IO wait]:\nnet.(*conn).Read(...)\n\t/usr/lib/go/src/net/net.go:196 +0x45\n" +
		"github.com/sockmesh/sockmesh/userspace-proxy/relay.Copy(...)\n\t/work/main/userspace-proxy/relay/relay.go:40 +0x1\n"
	testOnly := "goroutine 8 [chan receive]:\ngithub.com/sockmesh/sockmesh/userspace-proxy/proxy_test.helper(...)\n\t/work/main/userspace-proxy/proxy/harness_test.go:40 +0x1\n"
	for _, c := range []struct {
		stack string
		dirs  []string
		want  bool
	}{
		{stack, []string{"/userspace-proxy/"}, true},
		{stack, []string{"/datapath/", "/userspace-proxy/relay/"}, true},
		{stack, []string{"/agent/"}, false},
		{testOnly, []string{"/userspace-proxy/"}, false},
	} {
		if got := inDirs(c.stack, c.dirs); got != c.want {
			t.Errorf("inDirs(%q, %v) = %v, want %v", c.stack, c.dirs, got, c.want)
		}
	}
}

// TestCensusBeyond: a descriptor opened since the base census is beyond
// it, by what it refers to, even when one of the base's has closed since
// (a raw count would then be unchanged); once closed it is not.
func TestCensusBeyond(t *testing.T) {
	dir := t.TempDir()
	gone, err := os.Create(filepath.Join(dir, "gone"))
	if err != nil {
		t.Fatal(err)
	}
	base := Census(t)
	gone.Close()
	f, err := os.Create(filepath.Join(dir, "new"))
	if err != nil {
		t.Fatal(err)
	}
	if got := Census(t).Beyond(base); !slices.Equal(got, []string{f.Name()}) {
		t.Errorf("with %s open: Beyond = %v, want it alone", f.Name(), got)
	}
	f.Close()
	if got := Census(t).Beyond(base); len(got) != 0 {
		t.Errorf("with %s closed: Beyond = %v, want none", f.Name(), got)
	}
}
