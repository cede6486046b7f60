package upstreamtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
	uris      []string
	// verified remembers leaves already checked, until their chain
	// expires (a CA may expire before the leaf): resumed handshakes
	// present the same *x509.Certificate from the session cache, and
	// re-verifying the chain each time would cost what resumption saves.
	verified sync.Map // *x509.Certificate -> time.Time
}

func newSANVerifier(sans []snapshot.SubjectAltName, roots *x509.CertPool) (*sanVerifier, error) {
	v := &sanVerifier{roots: roots}
	for _, s := range sans {
		switch s.Type {
		case snapshot.SANHostname:
			v.hostnames = append(v.hostnames, s.Value)
		case snapshot.SANURI:
			v.uris = append(v.uris, s.Value)
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
	if until, ok := v.verified.Load(leaf); ok && time.Now().Before(until.(time.Time)) {
		return nil
	}
	opts := x509.VerifyOptions{Roots: v.roots, Intermediates: x509.NewCertPool()}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	chains, err := leaf.Verify(opts)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrVerify, err)
	}
	if !v.matches(leaf) {
		return fmt.Errorf("%w: certificate names %s match none of the subjectAltNames %s",
			ErrVerify, names(leaf), v.want())
	}
	v.verified.Store(leaf, validUntil(chains))
	return nil
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
			if u.String() == want {
				return true
			}
		}
	}
	return false
}

func (v *sanVerifier) want() string {
	w := append([]string(nil), v.hostnames...)
	return "[" + strings.Join(append(w, v.uris...), " ") + "]"
}

func names(c *x509.Certificate) string {
	n := append([]string(nil), c.DNSNames...)
	for _, u := range c.URIs {
		n = append(n, u.String())
	}
	return "[" + strings.Join(n, " ") + "]"
}
