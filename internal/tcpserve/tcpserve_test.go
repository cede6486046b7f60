package tcpserve_test

import (
	"bufio"
	"io"
	"net"
	"testing"

	"github.com/sockmesh/sockmesh/internal/tcpserve"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestRelay relays to an echo server and checks bytes cross both ways and
// that the test's end closes a connection still open.
func TestRelay(t *testing.T) {
	echo := listen(t)
	tcpserve.Serve(t, echo, func(c net.Conn) { io.Copy(c, c) })
	front := listen(t)
	var c net.Conn
	t.Run("relay", func(t *testing.T) {
		tcpserve.Relay(t, front, echo.Addr().String())
		var err error
		if c, err = net.Dial("tcp", front.Addr().String()); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "ping\n" {
			t.Fatalf("read through the relay = %q, %v; want %q", line, err, "ping\n")
		}
	})
	// The subtest's cleanup closed the relayed connection and the listener.
	defer c.Close()
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("read %d bytes from a relay whose test ended, want EOF or reset", n)
	}
	if c2, err := net.Dial("tcp", front.Addr().String()); err == nil {
		c2.Close()
		t.Error("the relay's listener still accepts after its test ended")
	}
}
