package sniff

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sockmesh/sockmesh/internal/tcpserve"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		kind Kind
		more bool
	}{
		{"empty", "", Opaque, true},
		{"tls clienthello", "\x16\x03\x01\x02\x00\x01\x00", TLS, false},
		{"tls record header only", "\x16\x03\x01\x02", Opaque, true},
		{"tls but not a hello", "\x16\x03\x03\x00\x10\x02", Opaque, false},
		{"0x16 not tls", "\x16\x99", Opaque, false},
		{"http/1 get", "GET / HTTP/1.1\r\n", HTTP1, false},
		{"http/1 patch", "PATCH /x HTTP/1.1", HTTP1, false},
		{"method prefix", "POS", Opaque, true},
		{"a longer token", "GETX", Opaque, true},
		{"extension method", "PROPFIND /dav/ HTTP/1.1\r\n", HTTP1, false},
		{"extension method, http/1.0, bare lf", "QUERY /q HTTP/1.0\n", HTTP1, false},
		{"extension method, line to come", "PROPFIND /dav/ HTTP/1", Opaque, true},
		{"no line within a read", "PROPFIND /" + strings.Repeat("d", readSize), Opaque, false},
		{"redis inline", "SET k v\r\n", Opaque, false},
		{"redis inline, line to come", "SET k v", Opaque, false},
		{"extension method, version to come", "PROPFIND /dav/ HTTP/1.1\r", Opaque, true},
		{"extension method, target to come", "PROPFIND /da", Opaque, true},
		{"extension method, space to come", "PROPFIND", Opaque, true},
		{"not a version, line to come", "PROPFIND /dav/ HTTP/2", Opaque, false},
		{"control byte in target, line to come", "FOO /a\x01", Opaque, false},
		{"no target, line to come", "FOO  /a", Opaque, false},
		{"token without space", "PING\r\n", Opaque, false},
		{"lowercase greeting", "hello", Opaque, false},
		{"longer than a method", strings.Repeat("A", 21), Opaque, false},
		{"space in target", "FOO a b HTTP/1.1\r\n", Opaque, false},
		{"h2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", HTTP2, false},
		{"h2 preface prefix", "PRI * HTTP/2", Opaque, true},
		{"postgres startup", "\x00\x00\x00\x08\x04\xd2\x16\x2f", Opaque, false},
		{"redis", "*1\r\n$4\r\nPING\r\n", Opaque, false},
	} {
		k, more := Classify([]byte(c.in))
		if k != c.kind || more != c.more {
			t.Errorf("%s: Classify(%q) = %v, %v; want %v, %v", c.name, c.in, k, more, c.kind, c.more)
		}
	}
}

// FuzzClassifyPrefixes: the bytes of a request line Classify takes for
// HTTP/1 are never judged opaque before they are all there — a client
// that sends its request in pieces is still sniffed as HTTP.
func FuzzClassifyPrefixes(f *testing.F) {
	for _, seed := range []string{"GET / HTTP/1.1\r\n", "PROPFIND /dav/ HTTP/1.1\r\n", "QUERY /q HTTP/1.0\n",
		"M-SEARCH * HTTP/1.1\r\n", "UPDATEREDIRECTREF /a%20b?c=d HTTP/1.1\r\n", "SET k v\r\n"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if k, _ := Classify(b); k != HTTP1 {
			return
		}
		for n := range len(b) {
			if k, more := Classify(b[:n]); k != HTTP1 && !more {
				t.Fatalf("Classify(%q) = %v, %v; its request line %q is HTTP/1", b[:n], k, more, b)
			}
		}
	})
}

// TestSniffReplays: what Sniff read comes back first, byte for byte, also
// when the client sends its first bytes in pieces.
func TestSniffReplays(t *testing.T) {
	for _, c := range []struct {
		chunks []string
		kind   Kind
	}{
		{[]string{"GET / HTTP/1.1\r\n\r\n"}, HTTP1},
		{[]string{"PROPFIND /calendars/", "user/home/ HTTP/1.1\r\n\r\n"}, HTTP1},
		{[]string{"PRI * HTTP", "/2.0\r\n\r\nSM\r\n\r\nrest"}, HTTP2},
		{[]string{"\x16\x03", "\x01\x00\x05\x01hello"}, TLS},
		{[]string{"hello world"}, Opaque},
	} {
		a, b := net.Pipe()
		go func() {
			for _, ch := range c.chunks {
				a.Write([]byte(ch))
			}
			a.Close()
		}()
		k, sc, err := Sniff(b, 0)
		if err != nil || k != c.kind {
			t.Fatalf("Sniff(%q) = %v, %v; want %v", c.chunks, k, err, c.kind)
		}
		got, _ := io.ReadAll(sc)
		want := ""
		for _, ch := range c.chunks {
			want += ch
		}
		if string(got) != want {
			t.Errorf("replayed %q, want %q", got, want)
		}
	}
}

// TestPeek: Peek waits for bytes past those Sniff read, also once the
// replay was drained and given back, and Read replays them after.
func TestPeek(t *testing.T) {
	a, b := net.Pipe()
	go func() {
		for _, ch := range []string{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "settings", "next"} {
			a.Write([]byte(ch))
		}
		a.Close()
	}()
	_, sc, err := Sniff(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := sc.Peek(len(HTTP2Preface) + len("settings")); err != nil || string(p) != HTTP2Preface+"settings" {
		t.Fatalf("Peek past the sniffed bytes = %q, %v", p, err)
	}
	if got, err := io.ReadAll(io.LimitReader(sc, int64(len(HTTP2Preface)+len("settings")))); err != nil || string(got) != HTTP2Preface+"settings" {
		t.Fatalf("read the peeked bytes = %q, %v", got, err)
	}
	if p, err := sc.Peek(len("next")); err != nil || string(p) != "next" {
		t.Fatalf("Peek after the replay was drained = %q, %v", p, err)
	}
	if got, _ := io.ReadAll(sc); string(got) != "next" {
		t.Errorf("replayed %q, want next", got)
	}
}

// TestSniffSilentClient: a client that waits for the server (a server-first
// protocol) is judged opaque when the timeout passes, and its later bytes
// still arrive.
func TestSniffSilentClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		k, sc, err := Sniff(b, time.Second)
		if err != nil || k != Opaque {
			t.Fatalf("Sniff = %v, %v; want opaque", k, err)
		}
		go a.Write([]byte("late"))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(sc, buf); err != nil || string(buf) != "late" {
			t.Fatalf("read after timeout = %q, %v", buf, err)
		}
	})
}

// TestSniffEndsEmpty: a connection that ends before any byte is opaque,
// and replays that end: Sniff cannot tell a close from a half-close, after
// which the app still reads (proxy's TestServerFirstHalfClosedApp).
func TestSniffEndsEmpty(t *testing.T) {
	a, b := net.Pipe()
	a.Close()
	k, sc, err := Sniff(b, 0)
	if err != nil || k != Opaque {
		t.Fatalf("Sniff = %v, %v; want opaque", k, err)
	}
	if n, err := sc.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read = %d, %v; want EOF", n, err)
	}
}

// TestSniffSockio: on a sockio.Conn, Sniff takes what already arrived
// without waiting, waits with its deadline for what has not, and leaves
// the connection as it found it either way — reads wait again, with no
// deadline (the later bytes come more than the short timeout after Sniff
// returned, so past any deadline it set). Bytes that must come within the
// timeout get a minute: a loaded machine can wake their writer past 100 ms
// (under CI-like load "in pieces" was judged opaque once in 600 runs).
func TestSniffSockio(t *testing.T) {
	const short, pause = 100 * time.Millisecond, 25 * time.Millisecond
	for _, c := range []struct {
		name    string
		chunks  []string // the first sent before Sniff, each next after a pause
		kind    Kind
		timeout time.Duration
	}{
		{"there", []string{"GET / HTTP/1.1\r\n\r\n"}, HTTP1, short},
		{"in pieces", []string{"GE", "T / HTTP/1.1\r\n\r\n"}, HTTP1, time.Minute},
		{"late", []string{"", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"}, HTTP2, time.Minute},
		{"silent", []string{""}, Opaque, short},
	} {
		t.Run(c.name, func(t *testing.T) {
			app, conn := tcpserve.Pair(t)
			app.Write([]byte(c.chunks[0]))
			tcpserve.WaitQueued(t, conn, int64(len(c.chunks[0])))
			sent := make(chan struct{})
			go func() {
				defer close(sent)
				for _, ch := range c.chunks[1:] {
					time.Sleep(pause)
					app.Write([]byte(ch))
				}
			}()
			k, sc, err := Sniff(sockio.Wrap(conn), c.timeout)
			if err != nil || k != c.kind {
				t.Fatalf("Sniff = %v, %v; want %v", k, err, c.kind)
			}
			go func() {
				<-sent
				time.Sleep(3 * short) // past the deadline Sniff may have set
				app.Write([]byte("later"))
			}()
			want := strings.Join(c.chunks, "") + "later"
			got := make([]byte, len(want))
			if _, err := io.ReadFull(sc, got); err != nil || string(got) != want {
				t.Errorf("read %q, %v; want %q", got, err, want)
			}
		})
	}
}

// TestSniffNow: Sniff with timeout Now does not wait for a silent client
// (on a sockio.Conn, or any other connection, which it cannot read without
// waiting), and its later bytes still arrive.
func TestSniffNow(t *testing.T) {
	app, conn := tcpserve.Pair(t)
	a, b := net.Pipe()
	defer a.Close()
	for name, c := range map[string]struct {
		app  io.Writer
		conn net.Conn
	}{"sockio": {app, sockio.Wrap(conn)}, "pipe": {a, b}} {
		t.Run(name, func(t *testing.T) {
			k, sc, err := Sniff(c.conn, Now)
			if err != nil || k != Opaque {
				t.Fatalf("Sniff = %v, %v; want opaque", k, err)
			}
			go c.app.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
			got := make([]byte, 18)
			if _, err := io.ReadFull(sc, got); err != nil || string(got) != "GET / HTTP/1.1\r\n\r\n" {
				t.Errorf("read %q, %v; want the request", got, err)
			}
		})
	}
}

// TestSniffReset: a client that resets its connection after a few bytes
// that decide nothing is an error, not opaque bytes: the socket reports a
// reset once, and reads after it end cleanly, so the bytes relayed on
// would reach the backend followed by a clean end of stream, a truncated
// request taken for a complete one.
func TestSniffReset(t *testing.T) {
	app, conn := tcpserve.Pair(t)
	app.Write([]byte("GE"))
	app.SetLinger(0)
	app.Close()
	k, sc, err := Sniff(sockio.Wrap(conn), time.Minute)
	if err == nil {
		got, rerr := io.ReadAll(sc)
		t.Fatalf("Sniff = %v with no error, then read %q, %v; want the reset as Sniff's error", k, got, rerr)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("Sniff error = %v, want the reset", err)
	}
}
