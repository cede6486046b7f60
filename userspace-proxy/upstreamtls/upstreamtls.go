package upstreamtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// ALPN protocol identifiers (RFC 7301 registry).
const (
	ALPNHTTP11 = "http/1.1"
	ALPNH2     = "h2"
)

// ErrInvalid is wrapped by New's errors: the settings cannot be honoured and
// the backend must fail closed.
var ErrInvalid = errors.New("invalid upstream tls settings")

// Options are the proxy-wide inputs that do not come from the snapshot.
type Options struct {
	// SystemRoots replaces the platform trust store for backends whose policy
	// asks for system roots; nil uses the platform's (crypto/tls default).
	// Tests set it to a pool they control.
	SystemRoots *x509.CertPool
	// SessionCacheSize is the number of TLS sessions kept per endpoint; 0
	// means 64.
	SessionCacheSize int
}

// Origination is the TLS client side for one backend in one snapshot. It is
// safe for concurrent use.
type Origination struct {
	settings *snapshot.TLS
	base     *tls.Config
	san      *sanVerifier     // nil: crypto/tls verifies
	client   *tls.Certificate // ClientAndServer's certificate, else nil
	cacheLen int
	// perEndpoint holds, per endpoint and ALPN list, a clone of base with its
	// own session cache: crypto/tls keys cached sessions by ServerName, which
	// all endpoints share, so one shared cache would offer endpoint A's
	// ticket to endpoint B and thrash.
	perEndpoint sync.Map // endpointKey -> *tls.Config
}

type endpointKey struct {
	addr netip.AddrPort
	alpn string
}

// New validates s and builds the base configuration. The returned error
// wraps ErrInvalid and names what is wrong.
func New(s *snapshot.TLS, o Options) (*Origination, error) {
	if s == nil {
		return nil, fmt.Errorf("build upstream tls: %w: no settings", ErrInvalid)
	}
	if s.ServerName == "" {
		return nil, fmt.Errorf("build upstream tls: %w: empty server name", ErrInvalid)
	}
	if _, err := netip.ParseAddr(s.ServerName); err == nil {
		// The server name is the SNI (the API's hostname), which RFC 6066
		// §3 forbids to be an address: crypto/tls would send none, and
		// check the certificate's IP SANs instead of a DNS name.
		return nil, fmt.Errorf("build upstream tls: %w: server name %s is an IP address", ErrInvalid, s.ServerName)
	}
	c := &tls.Config{
		ServerName:       s.ServerName,
		MinVersion:       s.MinVersion,
		MaxVersion:       s.MaxVersion,
		CipherSuites:     slices.Clone(s.CipherSuites),
		CurvePreferences: slices.Clone(s.Curves),
	}
	if c.MinVersion == 0 {
		c.MinVersion = tls.VersionTLS12
	}
	if c.MaxVersion != 0 && c.MaxVersion < c.MinVersion {
		return nil, fmt.Errorf("build upstream tls: %w: max version %#x below min %#x", ErrInvalid, c.MaxVersion, c.MinVersion)
	}
	switch {
	case s.SystemRoots && s.RootsPEM != "":
		return nil, fmt.Errorf("build upstream tls: %w: both system roots and a bundle", ErrInvalid)
	case s.SystemRoots:
		c.RootCAs = o.SystemRoots
	case s.RootsPEM != "":
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(s.RootsPEM)) {
			return nil, fmt.Errorf("build upstream tls: %w: no certificate in the CA bundle", ErrInvalid)
		}
		c.RootCAs = pool
	default:
		return nil, fmt.Errorf("build upstream tls: %w: no trust roots", ErrInvalid)
	}
	var san *sanVerifier
	if len(s.SubjectAltNames) > 0 {
		v, err := newSANVerifier(s.SubjectAltNames, c.RootCAs)
		if err != nil {
			return nil, fmt.Errorf("build upstream tls: %w: %w", ErrInvalid, err)
		}
		// crypto/tls can only check ServerName; SANs replace that check, so
		// its built-in verification is off and VerifyConnection does chain
		// and SAN checks itself, on full and resumed handshakes alike.
		c.InsecureSkipVerify = true
		c.VerifyConnection = v.verify
		san = v
	}
	var client *tls.Certificate
	switch s.Mode {
	case snapshot.TLSServerOnly, "":
	case snapshot.TLSMutual:
		pair, err := tls.X509KeyPair([]byte(s.ClientCertificatePEM), []byte(s.ClientKeyPEM))
		if err != nil {
			return nil, fmt.Errorf("build upstream tls: %w: client certificate: %w", ErrInvalid, err)
		}
		client = &pair
	default:
		return nil, fmt.Errorf("build upstream tls: %w: unknown mode %q", ErrInvalid, s.Mode)
	}
	c.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if asked, ok := cri.Context().Value(certificateRequestKey{}).(*atomic.Bool); ok {
			asked.Store(true) // WatchCertificateRequest's
		}
		if client == nil {
			return &tls.Certificate{}, nil // none sent, as crypto/tls sends without one
		}
		// Always sent, as OpenSSL's and Envoy's clients do: crypto/tls's own
		// choice among Certificates sends none when the server's request
		// names no CA of the chain, as with a leaf-only tls.crt whose
		// intermediate the server trusts without naming it. But never
		// outside its validity: translate judges the dates only when it
		// runs, and until the agent translates again after NotAfter the
		// snapshot still holds the certificate. Failing the handshake
		// there fails the connection closed (502 tls_handshake), where
		// sending no certificate would let a backend that asks for but
		// does not require one take the app without its identity.
		if err := validAt(client.Leaf, time.Now()); err != nil {
			return nil, err
		}
		return client, nil
	}
	n := o.SessionCacheSize
	if n == 0 {
		n = 64
	}
	return &Origination{settings: s, base: c, san: san, client: client, cacheLen: n}, nil
}

type certificateRequestKey struct{}

// WatchCertificateRequest returns ctx, to be a handshake's
// (tls.Conn.HandshakeContext), and a flag that the handshake sets when the
// server asks for a client certificate (CertificateRequest), whether
// there is one to send or not: a TLS 1.3 server judges what the client
// sent after the client's side of the handshake ended (RFC 8446 §4.4.2).
func WatchCertificateRequest(ctx context.Context) (context.Context, *atomic.Bool) {
	asked := new(atomic.Bool)
	return context.WithValue(ctx, certificateRequestKey{}, asked), asked
}

// errClientCertificate is wrapped by the error of a handshake that needed
// the client certificate outside its validity.
var errClientCertificate = errors.New("client certificate outside its validity")

// validAt returns an error, wrapping errClientCertificate, when leaf is
// outside its validity at now (RFC 5280 §4.1.2.5: NotBefore and NotAfter
// both belong to it).
func validAt(leaf *x509.Certificate, now time.Time) error {
	switch {
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("%w: not valid before %s", errClientCertificate, leaf.NotBefore.UTC().Format(time.RFC3339))
	case now.After(leaf.NotAfter):
		return fmt.Errorf("%w: expired at %s", errClientCertificate, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// clientCertSessions offers a cached session only while the client
// certificate is valid. A resumed handshake sends no certificate: the
// session carries the identity of the handshake that made it, and a
// backend that does not check that certificate's dates on resumption (Go's
// server does, not every one) would take it past its NotAfter. Without a
// session the handshake is a full one, which GetClientCertificate fails.
type clientCertSessions struct {
	tls.ClientSessionCache
	leaf *x509.Certificate
}

func (c clientCertSessions) Get(key string) (*tls.ClientSessionState, bool) {
	if validAt(c.leaf, time.Now()) != nil {
		return nil, false
	}
	return c.ClientSessionCache.Get(key)
}

// Settings returns the snapshot settings o was built from.
func (o *Origination) Settings() *snapshot.TLS { return o.settings }

// Config returns the client configuration for endpoint ep offering alpn,
// the protocols the caller speaks on the connection (none for opaque
// bytes). The result is shared: callers must not modify it.
func (o *Origination) Config(ep netip.AddrPort, alpn []string) *tls.Config {
	alpn = o.offer(alpn)
	k := endpointKey{addr: ep, alpn: alpnKey(alpn)}
	if c, ok := o.perEndpoint.Load(k); ok {
		return c.(*tls.Config)
	}
	c := o.base.Clone()
	c.NextProtos = alpn
	c.ClientSessionCache = tls.NewLRUClientSessionCache(o.cacheLen)
	if o.client != nil {
		c.ClientSessionCache = clientCertSessions{c.ClientSessionCache, o.client.Leaf}
	}
	got, _ := o.perEndpoint.LoadOrStore(k, c)
	return got.(*tls.Config)
}

// offer returns the ALPN list for a caller that speaks speaks: with a
// policy list, the policy's protocols the caller speaks, in the policy's
// order. Offered whole, the list let the backend pick a protocol the
// caller then refused: with "h2,http/1.1", every HTTP/1.1 request to a
// backend that speaks h2 failed. A caller that speaks none of them (opaque
// bytes, or a list of other protocols) offers the policy's list as is, and
// refuses by name what the backend picks.
func (o *Origination) offer(speaks []string) []string {
	policy := o.settings.ALPN
	if len(policy) == 0 {
		return speaks
	}
	var both []string
	for _, p := range policy {
		if slices.Contains(speaks, p) {
			both = append(both, p)
		}
	}
	if len(both) == 0 {
		return policy
	}
	return both
}

// ValidUntil returns when the trust in cs, the state of a connection o
// verified, ends: when the last of its verified chains expires, each when
// its first certificate does. A connection kept open past it would carry
// requests to a backend that no handshake would accept any more.
func (o *Origination) ValidUntil(cs tls.ConnectionState) time.Time {
	if o.san != nil {
		return o.san.validUntil(cs.PeerCertificates[0])
	}
	return validUntil(cs.VerifiedChains)
}

// Retain forgets the configs, and their sessions, of the endpoints keep
// does not name. An Origination outlives snapshots while its settings do
// (Equal): without it, every address its backend ever had — each rollout
// brings new pod IPs, an external host new DNS answers — kept a config and
// a session cache for the agent's life.
func (o *Origination) Retain(keep func(netip.AddrPort) bool) {
	o.perEndpoint.Range(func(k, _ any) bool {
		if !keep(k.(endpointKey).addr) {
			o.perEndpoint.Delete(k)
		}
		return true
	})
}

// Equal reports whether a and b would build the same Origination, so a new
// snapshot can keep an unchanged backend's configs and session caches.
func Equal(a, b *snapshot.TLS) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Mode == b.Mode && a.ServerName == b.ServerName && a.RootsPEM == b.RootsPEM &&
		a.SystemRoots == b.SystemRoots && slices.Equal(a.SubjectAltNames, b.SubjectAltNames) &&
		a.ClientCertificatePEM == b.ClientCertificatePEM && a.ClientKeyPEM == b.ClientKeyPEM &&
		a.MinVersion == b.MinVersion && a.MaxVersion == b.MaxVersion &&
		slices.Equal(a.CipherSuites, b.CipherSuites) && slices.Equal(a.Curves, b.Curves) &&
		slices.Equal(a.ALPN, b.ALPN)
}

func alpnKey(alpn []string) string {
	switch len(alpn) {
	case 0:
		return ""
	case 1:
		return alpn[0]
	}
	k := alpn[0]
	for _, p := range alpn[1:] {
		k += "," + p
	}
	return k
}
