package httpapi

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/internal/syncbuf"
	"github.com/sockmesh/sockmesh/test/pki"
)

// secretVolume lays files out as the kubelet does in a Secret or projected
// volume (daemonset/introspection-tcp projects two Secrets into one): each
// version in a directory of its own, reached through the ..data symlink,
// which a new version swaps atomically, whichever Secret changed; tls.crt,
// tls.key and token are symlinks through ..data.
type secretVolume struct {
	t   *testing.T
	dir string
	n   int
}

func newSecretVolume(t *testing.T) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir()}
	for _, name := range []string{"tls.crt", "tls.key", "token"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

func (v *secretVolume) paths() (certFile, keyFile, tokenFile string) {
	return filepath.Join(v.dir, "tls.crt"), filepath.Join(v.dir, "tls.key"), filepath.Join(v.dir, "token")
}

// write publishes a version holding files (name: contents).
func (v *secretVolume) write(files map[string][]byte) {
	v.t.Helper()
	v.n++
	version := fmt.Sprintf("..v%d", v.n)
	if err := os.Mkdir(filepath.Join(v.dir, version), 0o700); err != nil {
		v.t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(v.dir, version, name), b, 0o400); err != nil {
			v.t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
}

// TestCertificateReload checks that the TCP listener serves the certificate
// its files hold now: renewed in a Secret volume, the next connection gets
// it without a restart; files that do not load leave the last good pair
// serving, with one warning per change. A token rotated in the same
// volume applies at the next request, the certificate unchanged.
func TestCertificateReload(t *testing.T) {
	ca, err := pki.NewCA("introspection test CA")
	if err != nil {
		t.Fatal(err)
	}
	var leaves [3]*pki.Leaf
	for i := range leaves {
		if leaves[i], err = ca.Issue(pki.LeafOptions{CommonName: fmt.Sprintf("agent %d", i),
			IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}); err != nil {
			t.Fatal(err)
		}
	}
	token := "first"
	pair := func(l *pki.Leaf) map[string][]byte {
		return map[string][]byte{"tls.crt": l.CertPEM, "tls.key": l.KeyPEM, "token": []byte(token)}
	}
	vol := newSecretVolume(t)
	vol.write(pair(leaves[0]))
	certFile, keyFile, tokenFile := vol.paths()
	cfg := Config{Socket: filepath.Join(t.TempDir(), "agent.sock"), Listen: "127.0.0.1:0",
		TLSCertFile: certFile, TLSKeyFile: keyFile, TokenFile: tokenFile}

	var logs syncbuf.Buffer
	s, err := NewServer(cfg, testSources(t), slog.New(slog.NewTextHandler(&logs, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	_, addr := s.Addrs()
	// served returns the CommonName of the certificate a new connection
	// gets.
	served := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", addr.String(), &tls.Config{RootCAs: ca.Pool()})
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	const warning = "introspection certificate files changed but do not load"
	warnings := func() int { return strings.Count(logs.String(), warning) }

	if got := served(); got != "agent 0" {
		t.Fatalf("at start: served %q, want agent 0", got)
	}
	token = "second"
	vol.write(pair(leaves[0]))
	if old, rotated, got := statusCode(t, addr.String(), ca, "first"), statusCode(t, addr.String(), ca, "second"), served(); old != http.StatusUnauthorized || rotated != http.StatusOK || got != "agent 0" {
		t.Errorf("token rotated: the old one %d, the new one %d, served %q; want 401, 200, agent 0", old, rotated, got)
	}
	vol.write(pair(leaves[1]))
	if got := served(); got != "agent 1" {
		t.Fatalf("after renewal: served %q, want agent 1, without a restart", got)
	}

	for i, bad := range []struct {
		name  string
		files map[string][]byte
		err   string
	}{
		{"a key that does not match", map[string][]byte{"tls.crt": leaves[2].CertPEM, "tls.key": leaves[1].KeyPEM}, "private key does not match public key"},
		{"a certificate that is no PEM", map[string][]byte{"tls.crt": []byte("not a certificate"), "tls.key": leaves[2].KeyPEM}, "failed to find any PEM data in certificate input"},
		{"no key", map[string][]byte{"tls.crt": leaves[2].CertPEM}, "no such file or directory"},
	} {
		vol.write(bad.files)
		for range 2 {
			if got := served(); got != "agent 1" {
				t.Errorf("%s: served %q, want the last good certificate, agent 1", bad.name, got)
			}
		}
		if got := warnings(); got != i+1 {
			t.Errorf("%s: %d warnings in all, want %d: one per bad change\n%s", bad.name, got, i+1, logs.String())
		}
		if last := logs.String()[strings.LastIndex(logs.String(), warning):]; !strings.Contains(last, bad.err) {
			t.Errorf("%s: warning %q does not say %q", bad.name, last, bad.err)
		}
	}

	vol.write(pair(leaves[2]))
	if got := served(); got != "agent 2" {
		t.Errorf("good files after bad ones: served %q, want agent 2", got)
	}
	if !strings.Contains(logs.String(), "introspection certificate reloaded") {
		t.Errorf("no reload logged:\n%s", logs.String())
	}

	// The start stays strict: files that do not load refuse it.
	mismatched := newSecretVolume(t)
	mismatched.write(map[string][]byte{"tls.crt": leaves[0].CertPEM, "tls.key": leaves[1].KeyPEM})
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.TLSCertFile, cfg.TLSKeyFile, _ = mismatched.paths()
	if _, err := NewServer(cfg, testSources(t), nil, nil); err == nil || !strings.Contains(err.Error(), "load TLS certificate") {
		t.Errorf("NewServer with a key that does not match: %v, want a load TLS certificate error", err)
	}
}

// statusCode asks the agent at addr for its status with token, trusting
// ca, and returns the HTTP status.
func statusCode(t *testing.T, addr string, ca *pki.CA, token string) int {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+addr+PathStatus, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", PathStatus, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
