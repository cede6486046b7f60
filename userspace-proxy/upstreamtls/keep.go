package upstreamtls

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Held is one connection's TLS: the state its handshake settled, and the
// Origination it was made, or since kept, under. When its backend's
// settings change, Keep decides from it whether the connection may stay.
// The zero Held (a cleartext connection) stays under none.
type Held struct {
	by     *Origination
	state  tls.ConnectionState
	speaks []string
}

// Hold returns the Held of a connection o made for a caller that speaks
// speaks (Config's alpn), whose handshake settled cs.
func (o *Origination) Hold(cs tls.ConnectionState, speaks []string) Held {
	return Held{by: o, state: cs, speaks: speaks}
}

// Until returns when h's trust ends (ValidUntil); zero for the zero Held.
func (h Held) Until() time.Time {
	if h.by == nil {
		return time.Time{}
	}
	return h.by.ValidUntil(h.state)
}

// Keeper keeps connections under o, the backend's new settings, for one
// change of them: a node's thousands of gRPC channels to a backend share
// its certificate chain, which a change verified once per connection,
// under the lock of the caller's registry. Its verdicts are of the moment
// it is used in, not to be kept past that change.
type Keeper struct {
	o *Origination
	// verified holds, by peer certificate chain (chainKey), the chains
	// that verify it under o, or why none does.
	verified map[string]verdict
}

type verdict struct {
	chains [][]*x509.Certificate
	err    error
}

// Keeper returns a Keeper for a change of settings to o; nil for a nil
// o, under which no connection stays.
func (o *Origination) Keeper() *Keeper {
	if o == nil {
		return nil
	}
	return &Keeper{o: o, verified: make(map[string]verdict)}
}

// Keep returns h held under k's settings o when o would have made the
// connection as it is: the same server name and client certificate (a
// rotated one too, since what a backend authorizes by, and whether the
// old key is still trusted, is not the proxy's to know), its TLS version,
// cipher suite, curve and ALPN protocol among those o offers, and its
// peer's certificates verified now as a handshake under o verifies them
// (o's roots, subjectAltNames or server name, expiry), once per distinct
// chain. Trust that only widened (a CA added beside the one that verified
// it, a subjectAltName added) keeps the connection; trust withdrawn from
// it, or anything Keep cannot tell, does not. The error says why.
func (k *Keeper) Keep(h Held) (Held, error) {
	if k == nil {
		return Held{}, errors.New("keep upstream tls connection: no tls settings")
	}
	o := k.o
	if h.by == o {
		return h, nil
	}
	if h.by == nil || !h.state.HandshakeComplete || len(h.state.PeerCertificates) == 0 {
		return Held{}, errors.New("keep upstream tls connection: no verified handshake")
	}
	if err := o.accepts(h); err != nil {
		return Held{}, fmt.Errorf("keep upstream tls connection: %w", err)
	}
	key := chainKey(h.state.PeerCertificates)
	v, ok := k.verified[key]
	if !ok {
		v.chains, v.err = o.verifyPeer(h.state)
		k.verified[key] = v
	}
	if v.err != nil {
		return Held{}, fmt.Errorf("keep upstream tls connection: %w", v.err)
	}
	h.by = o
	if v.chains != nil {
		h.state.VerifiedChains = v.chains // ValidUntil's, under o
	}
	return h, nil
}

// chainKey is certs' DER, one after another: each is self-delimiting.
func chainKey(certs []*x509.Certificate) string {
	var b strings.Builder
	for _, c := range certs {
		b.Write(c.Raw)
	}
	return b.String()
}

// accepts checks all of h but its peer's certificates against o (Keep).
func (o *Origination) accepts(h Held) error {
	was, now, cs := h.by.base, o.base, h.state
	switch {
	case was.ServerName != now.ServerName:
		return fmt.Errorf("server name %s, now %s", was.ServerName, now.ServerName)
	case !sameCertificate(h.by.client, o.client):
		return errors.New("client certificate changed")
	case cs.Version < now.MinVersion || now.MaxVersion != 0 && cs.Version > now.MaxVersion:
		return fmt.Errorf("%s no longer allowed", tls.VersionName(cs.Version))
	case cs.Version < tls.VersionTLS13 && !allowed(was.CipherSuites, now.CipherSuites, cs.CipherSuite):
		// TLS 1.3's suites are not configurable.
		return fmt.Errorf("cipher suite %s no longer allowed", tls.CipherSuiteName(cs.CipherSuite))
	case !allowed(was.CurvePreferences, now.CurvePreferences, cs.CurveID):
		return fmt.Errorf("curve %s no longer allowed", cs.CurveID)
	}
	// The protocol it speaks must be one o offers; without one (the
	// backend chose none), o must offer what it offered.
	if offer := o.offer(h.speaks); !slices.Contains(offer, cs.NegotiatedProtocol) && !slices.Equal(offer, h.by.offer(h.speaks)) {
		return fmt.Errorf("alpn protocol %q no longer offered", cs.NegotiatedProtocol)
	}
	return nil
}

// verifyPeer verifies the peer's certificates of cs under o and returns
// the chains that verify them, nil when o checks subjectAltNames
// (ValidUntil then asks o's verifier).
func (o *Origination) verifyPeer(cs tls.ConnectionState) ([][]*x509.Certificate, error) {
	if o.san != nil {
		return nil, o.san.verify(cs)
	}
	return verifyChain(cs.PeerCertificates, o.base.RootCAs, o.base.ServerName)
}

// allowed reports whether v, negotiated when the connection's settings
// listed was, is one now allows: in now, or crypto/tls's defaults both
// times (both empty).
func allowed[T comparable](was, now []T, v T) bool {
	return len(was) == 0 && len(now) == 0 || slices.Contains(now, v)
}

func sameCertificate(a, b *tls.Certificate) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.EqualFunc(a.Certificate, b.Certificate, bytes.Equal)
}
