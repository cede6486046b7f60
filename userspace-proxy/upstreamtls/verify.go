package upstreamtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// ErrVerify is wrapped by every certificate verification failure of an
// upstream handshake, whether crypto/tls or the SAN check found it; callers
// map it to 502 and log the reason.
var ErrVerify = errors.New("upstream certificate verification failed")

// IsVerifyError reports whether err (from a handshake) is a certificate
// verification failure.
func IsVerifyError(err error) bool {
	var cve *tls.CertificateVerificationError
	return errors.Is(err, ErrVerify) || errors.As(err, &cve)
}

// sanVerifier checks the chain against roots and the leaf against a list of
// acceptable subjectAltNames.
type sanVerifier struct {
	roots     *x509.CertPool // nil: system roots
	hostnames []string
	uris      []*url.URL // hosts lowercased, as sameURI compares them
	// verified remembers leaves already checked, by their DER, until
	// their chain expires (a CA may expire before the leaf): resumed
	// handshakes present the same certificate, and re-verifying the chain
	// each time would cost what resumption saves. Keyed by DER, not by
	// *x509.Certificate: crypto/tls parses a certificate again once no
	// connection or session holds it, and each parse stayed an entry,
	// holding its certificate, until its chain expired.
	mu       sync.Mutex
	verified map[string]time.Time
}

func newSANVerifier(sans []snapshot.SubjectAltName, roots *x509.CertPool) (*sanVerifier, error) {
	v := &sanVerifier{roots: roots, verified: make(map[string]time.Time)}
	for _, s := range sans {
		switch s.Type {
		case snapshot.SANHostname:
			v.hostnames = append(v.hostnames, s.Value)
		case snapshot.SANURI:
			u, err := url.Parse(s.Value)
			if err != nil {
				return nil, fmt.Errorf("subjectAltName URI %q: %w", s.Value, err)
			}
			u.Host = strings.ToLower(u.Host)
			v.uris = append(v.uris, u)
		default:
			return nil, fmt.Errorf("unknown subjectAltName type %q", s.Type)
		}
	}
	return v, nil
}

func (v *sanVerifier) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: no certificate presented", ErrVerify)
	}
	leaf := cs.PeerCertificates[0]
	now := time.Now()
	v.mu.Lock()
	until, ok := v.verified[string(leaf.Raw)]
	v.mu.Unlock()
	if ok && now.Before(until) {
		return nil
	}
	chains, err := verifyChain(cs.PeerCertificates, v.roots, "")
	if err != nil {
		return err
	}
	if !v.matches(leaf) {
		return fmt.Errorf("%w: certificate names %s match none of the subjectAltNames %s",
			ErrVerify, names(leaf), v.want())
	}
	v.remember(leaf, validUntil(chains), now)
	return nil
}

// verifyChain verifies certs, a peer's certificates leaf first, against
// roots (nil: the system's) at now, and the leaf against dnsName unless
// empty, as crypto/tls does in a handshake.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, dnsName string) ([][]*x509.Certificate, error) {
	opts := x509.VerifyOptions{Roots: roots, DNSName: dnsName, Intermediates: x509.NewCertPool()}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	chains, err := certs[0].Verify(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrVerify, err)
	}
	return chains, nil
}

// validUntil returns when leaf's verification ends: what verify
// remembered, or now when it has forgotten it (its chain expired).
func (v *sanVerifier) validUntil(leaf *x509.Certificate) time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	if until, ok := v.verified[string(leaf.Raw)]; ok {
		return until
	}
	return time.Now()
}

// remember records leaf as verified until until, and forgets the leaves
// whose time has passed (rotated certificates): what it holds are the
// certificates the backend presents now.
func (v *sanVerifier) remember(leaf *x509.Certificate, until, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for k, u := range v.verified {
		if !now.Before(u) {
			delete(v.verified, k)
		}
	}
	v.verified[string(leaf.Raw)] = until
}

// validUntil is when the last of chains to stay valid expires: each, when
// the first of its certificates does.
func validUntil(chains [][]*x509.Certificate) time.Time {
	var until time.Time
	for _, chain := range chains {
		end := chain[0].NotAfter
		for _, c := range chain[1:] {
			if c.NotAfter.Before(end) {
				end = c.NotAfter
			}
		}
		if end.After(until) {
			until = end
		}
	}
	return until
}

func (v *sanVerifier) matches(leaf *x509.Certificate) bool {
	for _, h := range v.hostnames {
		if leaf.VerifyHostname(h) == nil {
			return true
		}
	}
	for _, want := range v.uris {
		for _, u := range leaf.URIs {
			if sameURI(want, u) {
				return true
			}
		}
	}
	return false
}

// sameURI compares a wanted URI (host lowercased) with a certificate's as
// RFC 3986 does: the scheme (§3.1; url.Parse lowercases it) and the host
// (§3.2.2) case-insensitively, the rest, userinfo and path included, exactly.
func sameURI(want, got *url.URL) bool {
	g := *got
	g.Host = strings.ToLower(g.Host)
	return g.String() == want.String()
}

func (v *sanVerifier) want() string {
	w := append([]string(nil), v.hostnames...)
	for _, u := range v.uris {
		w = append(w, u.String())
	}
	return "[" + strings.Join(w, " ") + "]"
}

func names(c *x509.Certificate) string {
	n := append([]string(nil), c.DNSNames...)
	for _, u := range c.URIs {
		n = append(n, u.String())
	}
	return "[" + strings.Join(n, " ") + "]"
}
