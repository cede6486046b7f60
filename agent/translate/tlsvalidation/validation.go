package tlsvalidation

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// CAKey is the key of a ConfigMap or Secret that holds a CA bundle.
const CAKey = "ca.crt"

// Limits of BackendTLSPolicyValidation's fields (CRD MaxItems and
// MaxLength), checked again: a cluster's CRD may be of another version or
// channel than v1.7.0 experimental.
const (
	maxCACertificateRefs = 8
	maxSubjectAltNames   = 5
	maxNameLen           = 253 // PreciseHostname, Hostname, AbsoluteURI
)

// Objects gives the validators the objects a reference may name. Each
// method returns nil when the object does not exist.
type Objects interface {
	ConfigMap(namespace, name string) *corev1.ConfigMap
	Secret(namespace, name string) *corev1.Secret
	ClusterTrustBundle(name string) *certificatesv1.ClusterTrustBundle
}

// Problem says, in Gateway API terms, why settings cannot be honoured.
type Problem struct {
	// Reason is the condition reason (Invalid, NoValidCACertificate,
	// InvalidCACertificateRef, InvalidKind, InvalidCertificateRef,
	// RefNotPermitted).
	Reason string
	// Message names the field or reference at fault and why.
	Message string
}

func (p *Problem) Error() string { return p.Reason + ": " + p.Message }

// Result is the outcome of Validate.
type Result struct {
	// TLS has ServerName, RootsPEM or SystemRoots, and SubjectAltNames set.
	// Use it only when Accepted is nil.
	TLS snapshot.TLS
	// Accepted is non-nil when the settings cannot be used at all: reason
	// Invalid (a field is wrong) or NoValidCACertificate (every CA reference
	// is invalid). Connections must then fail closed.
	Accepted *Problem
	// ResolvedRefs is non-nil when at least one CA reference is invalid
	// (reason InvalidKind when any names an unsupported kind, else
	// InvalidCACertificateRef when any is missing or malformed, else
	// CACertificateOutsideValidity: no certificate it holds is valid at
	// now). The valid references still form the trust bundle: trusting
	// fewer anchors never weakens verification.
	ResolvedRefs *Problem
	// ChangesAt is the first instant after now at which a CA reference
	// becomes valid or invalid by the validity of its certificates (zero
	// when none does): the caller judges again then.
	ChangesAt time.Time
}

// Validate checks v and resolves its CA references in namespace (the
// policy's or XBackend's own: references never cross namespaces). field is
// v's path for messages ("validation", "tls.validation").
// clusterTrustBundlesUnavailable makes ClusterTrustBundle references
// InvalidKind (GEP-5075). A reference is judged by its certificates'
// validity at now. A nil v is Invalid.
func Validate(v *gwv1.BackendTLSPolicyValidation, field, namespace string, objs Objects, clusterTrustBundlesUnavailable bool, now time.Time) Result {
	var r Result
	if v == nil {
		r.Accepted = &Problem{Reason: ReasonInvalid, Message: field + " is not set"}
		return r
	}
	var invalid []string
	if err := checkHostname(string(v.Hostname), false); err != "" {
		invalid = append(invalid, field+".hostname "+err)
	}
	r.TLS.ServerName = string(v.Hostname)
	if len(v.SubjectAltNames) > maxSubjectAltNames {
		invalid = append(invalid, fmt.Sprintf("%s.subjectAltNames has %d entries, more than the %d allowed", field, len(v.SubjectAltNames), maxSubjectAltNames))
	}
	if len(v.CACertificateRefs) > maxCACertificateRefs {
		invalid = append(invalid, fmt.Sprintf("%s.caCertificateRefs has %d entries, more than the %d allowed", field, len(v.CACertificateRefs), maxCACertificateRefs))
	}
	for i, san := range v.SubjectAltNames {
		s, err := subjectAltName(san)
		if err != "" {
			invalid = append(invalid, fmt.Sprintf("%s.subjectAltNames[%d] %s", field, i, err))
			continue
		}
		r.TLS.SubjectAltNames = append(r.TLS.SubjectAltNames, s)
	}

	wellKnown := ""
	if v.WellKnownCACertificates != nil {
		wellKnown = string(*v.WellKnownCACertificates)
		if wellKnown == "" {
			// The CRD (MinLength 1) refuses "", though its CEL rules read
			// it as unset.
			invalid = append(invalid, field+".wellKnownCACertificates is set but empty")
		}
	}
	switch {
	case wellKnown != "" && len(v.CACertificateRefs) > 0:
		invalid = append(invalid, field+" sets both caCertificateRefs and wellKnownCACertificates; set exactly one")
	case wellKnown == "" && len(v.CACertificateRefs) == 0:
		invalid = append(invalid, field+" sets neither caCertificateRefs nor wellKnownCACertificates; set exactly one")
	case wellKnown == string(gwv1.WellKnownCACertificatesSystem):
		r.TLS.SystemRoots = true
	case wellKnown != "":
		invalid = append(invalid, fmt.Sprintf("%s.wellKnownCACertificates %q is not supported (sockmesh supports %q)",
			field, wellKnown, gwv1.WellKnownCACertificatesSystem))
	}

	// References are resolved even when a field is invalid, so the
	// ResolvedRefs condition is right on its own.
	if len(v.CACertificateRefs) > 0 {
		roots, refProblem, changesAt := caBundle(v.CACertificateRefs, namespace, objs, clusterTrustBundlesUnavailable, now)
		r.ResolvedRefs, r.ChangesAt = refProblem, changesAt
		r.TLS.RootsPEM = roots
		if roots == "" && len(invalid) == 0 {
			r.Accepted = &Problem{Reason: ReasonNoValidCACertificate, Message: "no valid CA certificate: " + refProblem.Message}
		}
	}
	if len(invalid) > 0 {
		r.Accepted = &Problem{Reason: ReasonInvalid, Message: strings.Join(invalid, "; ")}
	}
	return r
}

// caBundle resolves refs and returns the valid certificates as one
// canonical PEM bundle (in reference order, duplicates dropped), a problem
// naming every invalid reference, and when a reference's validity at now
// next changes (zero: never).
//
// A reference none of whose certificates is valid at now is invalid: a
// chain through it fails verification in the proxy (crypto/x509 checks
// every certificate's validity, its roots' too), so the owner should read
// why in the status rather than in a failed handshake. Its other
// certificates keep a reference valid: a bundle carries an expired CA
// beside its successor while backends move to the new one.
func caBundle(refs []gwv1.LocalObjectReference, namespace string, objs Objects, ctbUnavailable bool, now time.Time) (string, *Problem, time.Time) {
	cache := certCacheOf(objs)
	var (
		valid     []*parsedBundle
		problems  []string
		badKind   bool
		badRef    bool // missing or malformed
		changesAt time.Time
	)
	for _, ref := range refs {
		data, what, err, kindErr := caData(ref, namespace, objs, ctbUnavailable)
		if err != "" {
			badKind = badKind || kindErr
			badRef = true
			problems = append(problems, what+": "+err)
			continue
		}
		p := cache.parse(data)
		if p.err != "" {
			badRef = true
			problems = append(problems, what+": "+p.err)
			continue
		}
		changesAt = earliest(changesAt, p.validityChangesAfter(now))
		if msg := p.outsideValidity(now); msg != "" {
			problems = append(problems, what+": "+msg)
			continue
		}
		valid = append(valid, p)
	}
	var roots string
	switch len(valid) {
	case 0:
	case 1:
		// The common case: one reference. Its canonical PEM is shared by
		// every policy that names the same bytes.
		roots = valid[0].pem
	default:
		var bundle strings.Builder
		seen := map[string]bool{}
		for _, p := range valid {
			for i, c := range p.certs {
				if !seen[string(c.Raw)] {
					seen[string(c.Raw)] = true
					bundle.WriteString(p.pems[i])
				}
			}
		}
		roots = bundle.String()
	}
	if len(problems) == 0 {
		return roots, nil, changesAt
	}
	reason := ReasonCACertificateOutsideValidity
	switch {
	case badKind:
		reason = ReasonInvalidKind
	case badRef:
		reason = ReasonInvalidCACertificateRef
	}
	return roots, &Problem{Reason: reason, Message: strings.Join(problems, "; ")}, changesAt
}

// earliest returns the earlier of a and b, zero meaning never.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// CertCache remembers what CA bundle bytes parse to, for the length of one
// translation: at 1,000 policies naming a handful of CA ConfigMaps, parsing
// and re-encoding the same certificates for each policy was a fifth of a
// translation's time, and every policy kept its own copy of the PEM. An
// Objects that also has a CertCache method (CertCacher) shares one cache
// among all its Validate calls; without one, each call parses afresh. The
// zero CertCache is ready to use; it is not safe for concurrent use.
type CertCache struct {
	parsed map[string]*parsedBundle
}

// CertCacher is an Objects that carries a CertCache.
type CertCacher interface {
	CertCache() *CertCache
}

// parsedBundle is one CA bundle's bytes, parsed.
type parsedBundle struct {
	// certs are its distinct certificates in order, pems their canonical
	// PEM blocks, and pem all of them in one string.
	certs []*x509.Certificate
	pems  []string
	pem   string
	err   string // why the bytes are no valid bundle; then the rest is empty
	// byStart is certs by NotBefore, for validityChangesAfter.
	byStart []*x509.Certificate
}

func certCacheOf(objs Objects) *CertCache {
	if c, ok := objs.(CertCacher); ok {
		if cache := c.CertCache(); cache != nil {
			return cache
		}
	}
	return &CertCache{}
}

func (c *CertCache) parse(data []byte) *parsedBundle {
	if p, ok := c.parsed[string(data)]; ok {
		return p
	}
	p := &parsedBundle{}
	certs, err := parseCertificates(data)
	if err != "" {
		p.err = err
	} else {
		var all bytes.Buffer
		seen := map[string]bool{}
		for _, c := range certs {
			if seen[string(c.Raw)] {
				continue
			}
			seen[string(c.Raw)] = true
			block := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
			p.certs = append(p.certs, c)
			p.pems = append(p.pems, block)
			all.WriteString(block)
		}
		p.pem = all.String()
		p.byStart = slices.SortedFunc(slices.Values(p.certs), func(a, b *x509.Certificate) int { return a.NotBefore.Compare(b.NotBefore) })
	}
	if c.parsed == nil {
		c.parsed = map[string]*parsedBundle{}
	}
	c.parsed[string(data)] = p
	return p
}

const errKind = "unsupported kind (sockmesh supports ConfigMap, Secret and certificates.k8s.io ClusterTrustBundle)"

// caData finds the PEM text a reference names. what describes the
// reference for messages; kindErr says err is about the kind, not the
// object.
func caData(ref gwv1.LocalObjectReference, namespace string, objs Objects, ctbUnavailable bool) (data []byte, what, err string, kindErr bool) {
	name := string(ref.Name)
	switch {
	case ref.Group == "" && ref.Kind == "ConfigMap":
		what = "ConfigMap " + namespace + "/" + name
		cm := objs.ConfigMap(namespace, name)
		switch {
		case cm == nil:
			return nil, what, "not found", false
		case cm.Data[CAKey] != "":
			return []byte(cm.Data[CAKey]), what, "", false
		case len(cm.BinaryData[CAKey]) > 0:
			return cm.BinaryData[CAKey], what, "", false
		}
		return nil, what, "has no key " + CAKey, false
	case ref.Group == "" && ref.Kind == "Secret":
		what = "Secret " + namespace + "/" + name
		s := objs.Secret(namespace, name)
		switch {
		case s == nil:
			return nil, what, "not found", false
		case len(s.Data[CAKey]) > 0:
			return s.Data[CAKey], what, "", false
		}
		return nil, what, "has no key " + CAKey, false
	case ref.Group == certificatesv1.GroupName && ref.Kind == "ClusterTrustBundle":
		what = "ClusterTrustBundle " + name
		if ctbUnavailable {
			return nil, what, errKind + ": this cluster does not serve certificates.k8s.io/v1 ClusterTrustBundle", true
		}
		b := objs.ClusterTrustBundle(name)
		switch {
		case b == nil:
			return nil, what, "not found", false
		case b.Spec.TrustBundle == "":
			return nil, what, "spec.trustBundle is empty", false
		}
		return []byte(b.Spec.TrustBundle), what, "", false
	}
	what = fmt.Sprintf("%s %s (group %q)", ref.Kind, name, ref.Group)
	return nil, what, errKind, true
}

// pemBegin starts every PEM block's first line (RFC 7468 §2).
var pemBegin = []byte("-----BEGIN")

// parseCertificates returns every CERTIFICATE block in data, parsed as
// X.509. Text between blocks is ignored (as
// ClusterTrustBundle consumers may); any other block type (a private key
// put in a CA bundle by mistake), or a block that does not decode (a
// certificate corrupted or cut short), makes the bundle invalid.
func parseCertificates(data []byte) ([]*x509.Certificate, string) {
	var certs []*x509.Certificate
	for n := 1; ; n++ {
		block, rest := pem.Decode(data)
		// pem.Decode passes over a block it cannot decode and returns the
		// next one (or none): a BEGIN line before the one it returns, or
		// left in data without one, is such a block. Dropping it would
		// trust fewer CAs than the owner listed, and say nothing.
		read := data
		if block != nil {
			read = data[:len(data)-len(rest)]
		}
		if bytes.Count(read, pemBegin) > 1 || block == nil && bytes.Contains(read, pemBegin) {
			return nil, fmt.Sprintf("%s PEM block %d does not decode (corrupted or cut short)", CAKey, n)
		}
		if block == nil {
			break
		}
		data = rest
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Sprintf("%s holds a PEM block of type %q; only CERTIFICATE blocks are allowed", CAKey, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Sprintf("%s certificate %d does not parse: %v", CAKey, n, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, CAKey + " holds no PEM certificate"
	}
	return certs, ""
}

// subjectAltName checks one SAN entry the way the CRD's CEL rules do.
func subjectAltName(san gwv1.SubjectAltName) (snapshot.SubjectAltName, string) {
	switch san.Type {
	case gwv1.HostnameSubjectAltNameType:
		if san.URI != "" {
			return snapshot.SubjectAltName{}, "must not set uri when type is Hostname"
		}
		if err := checkHostname(string(san.Hostname), true); err != "" {
			return snapshot.SubjectAltName{}, "hostname " + err
		}
		return snapshot.SubjectAltName{Type: snapshot.SANHostname, Value: string(san.Hostname)}, ""
	case gwv1.URISubjectAltNameType:
		if san.Hostname != "" {
			return snapshot.SubjectAltName{}, "must not set hostname when type is URI"
		}
		if len(san.URI) > maxNameLen {
			return snapshot.SubjectAltName{}, fmt.Sprintf("uri is longer than %d bytes", maxNameLen)
		}
		if _, err := url.Parse(string(san.URI)); err != nil || !absoluteURI(string(san.URI)) {
			return snapshot.SubjectAltName{}, fmt.Sprintf("uri %q is not an absolute URI (scheme://authority...)", san.URI)
		}
		return snapshot.SubjectAltName{Type: snapshot.SANURI, Value: string(san.URI)}, ""
	}
	return snapshot.SubjectAltName{}, fmt.Sprintf("type %q is not Hostname or URI", san.Type)
}

// absoluteURI reports whether s starts as the AbsoluteURI type's pattern
// requires, ^([^:/?#]+):// (RFC 3986's URI regex with the authority made
// mandatory): a scheme, then "://" right after it.
func absoluteURI(s string) bool {
	scheme, rest, ok := strings.Cut(s, ":")
	return ok && scheme != "" && !strings.ContainsAny(scheme, "/?#") && strings.HasPrefix(rest, "//")
}

// checkHostname returns why h is not a DNS name ("" when it is). A leading
// "*." label is allowed when wildcard is set (SAN hostnames).
func checkHostname(h string, wildcard bool) string {
	if h == "" {
		return "is empty"
	}
	if len(h) > maxNameLen {
		return fmt.Sprintf("is longer than %d bytes", maxNameLen)
	}
	name := h
	if wildcard {
		name = strings.TrimPrefix(h, "*.")
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Sprintf("%q is not a valid DNS name: %s", h, errs[0])
	}
	// The CRD's pattern lets dotted digits through, but the types
	// (PreciseHostname, Hostname) allow no IP address: crypto/tls would
	// send no SNI for it and check IP SANs instead of DNS names.
	if _, err := netip.ParseAddr(name); err == nil {
		return fmt.Sprintf("%q is an IP address, not a DNS name", h)
	}
	return ""
}
