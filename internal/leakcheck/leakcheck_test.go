package leakcheck

import "testing"

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
