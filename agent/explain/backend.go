package explain

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Backend is the operator's view of one Snapshot backend: where the proxy
// sends connections and what the wire to it looks like.
type Backend struct {
	Ref snapshot.BackendRef `json:"ref"`
	// Sources are the objects that shaped it (BackendTLSPolicy, XBackend,
	// XBackendTrafficPolicy, the Service whose port's appProtocol chose
	// Protocol).
	Sources []snapshot.ObjectRef `json:"sources,omitempty"`
	// AppProtocol is that Service port's appProtocol.
	AppProtocol string `json:"appProtocol,omitempty"`
	// Protocol is the protocol the backend's owner declared ("" when none:
	// the proxy keeps the app's own).
	Protocol snapshot.Protocol `json:"protocol,omitempty"`
	// Wire says in words what the proxy speaks to the backend.
	Wire string `json:"wire"`
	// Hostname is an ExternalHostname XBackend's host.
	Hostname string `json:"hostname,omitempty"`
	TLS      *TLS   `json:"tls,omitempty"`
	// Endpoints counts the addresses the proxy may dial; ReadyEndpoints the
	// ready ones it prefers, FallbackEndpoints the ready ones topology
	// hints leave to other nodes or zones, which it takes only while none
	// of the others can (snapshot.Endpoint.Fallback); DrainingEndpoints
	// those not ready that serve while they terminate, which it takes only
	// while none is ready.
	Endpoints         int `json:"endpoints"`
	ReadyEndpoints    int `json:"readyEndpoints"`
	FallbackEndpoints int `json:"fallbackEndpoints,omitempty"`
	DrainingEndpoints int `json:"drainingEndpoints,omitempty"`
	// Invalid says why the proxy refuses every connection to it (fail
	// closed: HTTP 503 or a TCP reset, never plaintext).
	Invalid            *snapshot.Invalid            `json:"invalid,omitempty"`
	SessionPersistence *snapshot.SessionPersistence `json:"sessionPersistence,omitempty"`
	// RetryConstraint is the XBackendTrafficPolicy's retry budget.
	RetryConstraint *snapshot.RetryConstraint `json:"retryConstraint,omitempty"`
}

// TLS is the origination the proxy performs, without key material.
type TLS struct {
	Policy snapshot.ObjectRef `json:"policy"`
	Mode   snapshot.TLSMode   `json:"mode"`
	// ServerName is the SNI; the backend's certificate must carry it
	// unless SubjectAltNames are set.
	ServerName      string                    `json:"serverName"`
	SubjectAltNames []snapshot.SubjectAltName `json:"subjectAltNames,omitempty"`
	// Trust is "system roots" or the CA bundle's certificates.
	SystemRoots bool            `json:"systemRoots,omitempty"`
	CAs         []CACertificate `json:"cas,omitempty"`
	// ClientCertificate is the subject of the certificate presented in
	// ClientAndServer mode (its key is never shown).
	ClientCertificate string   `json:"clientCertificate,omitempty"`
	MinVersion        string   `json:"minVersion,omitempty"`
	MaxVersion        string   `json:"maxVersion,omitempty"`
	CipherSuites      []string `json:"cipherSuites,omitempty"`
	Curves            []string `json:"curves,omitempty"`
	// ALPN is what the proxy offers in the handshake.
	ALPN []string `json:"alpn,omitempty"`
}

// CACertificate is one certificate of a trust bundle.
type CACertificate struct {
	Subject  string    `json:"subject"`
	NotAfter time.Time `json:"notAfter,omitzero"`
	// Error is set for a PEM block that is not a certificate.
	Error string `json:"error,omitempty"`
}

// DescribeBackend returns the operator's view of b.
func DescribeBackend(b *snapshot.Backend) Backend {
	out := Backend{
		Ref: b.Ref, Sources: b.Sources, AppProtocol: b.AppProtocol, Protocol: b.Protocol, Hostname: b.Hostname,
		Invalid: b.Invalid, SessionPersistence: b.SessionPersistence, RetryConstraint: b.RetryConstraint,
		Endpoints: len(b.Endpoints), Wire: Wire(b.Protocol, b.TLS != nil),
	}
	for _, ep := range b.Endpoints {
		switch {
		case ep.Ready && ep.Fallback > 0:
			out.FallbackEndpoints++
		case ep.Ready:
			out.ReadyEndpoints++
		case ep.Serving && ep.Terminating:
			out.DrainingEndpoints++
		}
	}
	if b.TLS != nil {
		out.TLS = describeTLS(b.TLS, b.Protocol)
	}
	return out
}

// unreachable says why the proxy has no endpoint of b to dial (its
// connections and requests fail: no_endpoints), or "" when it has one or
// b fails closed anyway.
func (b *Backend) unreachable() string {
	switch {
	case b.Invalid != nil || b.ReadyEndpoints+b.FallbackEndpoints+b.DrainingEndpoints > 0:
		return ""
	case b.Hostname != "":
		return "no address for " + b.Hostname + " (not resolved yet, or it did not resolve)"
	}
	return "no endpoint ready, nor serving while it terminates"
}

// Wire describes the connection to a backend of protocol p, as the
// snapshot.Protocol constants define it.
func Wire(p snapshot.Protocol, withTLS bool) string {
	var s string
	switch p {
	case snapshot.ProtocolTCP:
		s = "opaque TCP"
	case snapshot.ProtocolHTTP:
		s = "HTTP, version negotiated"
	case snapshot.ProtocolHTTP11:
		s = "HTTP/1.1"
	case snapshot.ProtocolHTTP2:
		s = "HTTP/2"
	case snapshot.ProtocolH2C:
		s = "HTTP/2 with prior knowledge (h2c)"
	case snapshot.ProtocolGRPC:
		s = "gRPC (HTTP/2)"
	case snapshot.ProtocolWS, snapshot.ProtocolWSS:
		s = "WebSocket over HTTP/1.1"
	case snapshot.ProtocolMCP:
		s = "MCP (streamable HTTP)"
	default:
		s = "the app's own protocol"
	}
	if withTLS {
		return s + " in TLS"
	}
	return s + " in cleartext"
}

// alpn is what the proxy offers for protocol p in TLS (DESIGN.md: HTTP2 and
// GRPC h2; HTTP11 and WSS http/1.1; HTTP both), unless the policy names
// its own.
func alpn(p snapshot.Protocol, own []string) []string {
	if len(own) > 0 {
		return own
	}
	switch p {
	case snapshot.ProtocolHTTP2, snapshot.ProtocolGRPC:
		return []string{"h2"}
	case snapshot.ProtocolHTTP11, snapshot.ProtocolWSS, snapshot.ProtocolWS:
		return []string{"http/1.1"}
	case snapshot.ProtocolHTTP:
		return []string{"h2", "http/1.1"}
	}
	return nil // the app's own protocol: whatever it speaks, no ALPN forced
}

func describeTLS(t *snapshot.TLS, p snapshot.Protocol) *TLS {
	out := &TLS{
		Policy: t.Policy, Mode: t.Mode, ServerName: t.ServerName, SubjectAltNames: t.SubjectAltNames,
		SystemRoots: t.SystemRoots, ALPN: alpn(p, t.ALPN),
	}
	if t.RootsPEM != "" {
		out.CAs = certificates(t.RootsPEM)
	}
	if t.ClientCertificatePEM != "" {
		if certs := certificates(t.ClientCertificatePEM); len(certs) > 0 {
			out.ClientCertificate = certs[0].Subject
			if certs[0].Error != "" {
				out.ClientCertificate = certs[0].Error
			}
		}
	}
	if t.MinVersion != 0 {
		out.MinVersion = tls.VersionName(t.MinVersion)
	}
	if t.MaxVersion != 0 {
		out.MaxVersion = tls.VersionName(t.MaxVersion)
	}
	for _, c := range t.CipherSuites {
		out.CipherSuites = append(out.CipherSuites, tls.CipherSuiteName(c))
	}
	for _, c := range t.Curves {
		out.Curves = append(out.Curves, c.String())
	}
	return out
}

// certificates lists the certificates of a PEM bundle; only CERTIFICATE
// blocks are read, so a key pasted by mistake is never echoed.
func certificates(bundle string) []CACertificate {
	var out []CACertificate
	rest := []byte(bundle)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			out = append(out, CACertificate{Error: fmt.Sprintf("a %s block, not a certificate", strings.ToLower(block.Type))})
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			out = append(out, CACertificate{Error: fmt.Sprintf("unparsable certificate: %v", err)})
			continue
		}
		out = append(out, CACertificate{Subject: c.Subject.String(), NotAfter: c.NotAfter.UTC()})
	}
	return out
}
