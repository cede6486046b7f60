package tlsvalidation

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// BackendTLSPolicy option keys sockmesh understands. Values are
// comma-separated lists where several values make sense; spaces around
// items are ignored. Keys under another domain belong to other
// implementations and are ignored; an unknown sockmesh.io/ key (the domain
// in any case), an unprefixed key (Gateway API reserves those for keys it
// defines, and v1.7.0 defines none), or a value sockmesh cannot honour,
// makes the policy Invalid (never silently weaker).
const (
	// OptionMinTLSVersion is "1.2" or "1.3" (also "TLSv1.2", "TLSv1.3");
	// older versions are refused.
	OptionMinTLSVersion = "sockmesh.io/min-tls-version"
	// OptionMaxTLSVersion is "1.2" or "1.3"; not below the minimum.
	OptionMaxTLSVersion = "sockmesh.io/max-tls-version"
	// OptionCipherSuites lists TLS 1.2 cipher suites by their IANA names
	// (as crypto/tls spells them, e.g.
	// TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256): the set offered, which
	// crypto/tls orders by its own preference (Config.CipherSuites).
	// Suites crypto/tls deems insecure and TLS 1.3 suites (which are not
	// configurable) are refused, as is the option when the minimum version
	// is 1.3 (it would have no effect).
	OptionCipherSuites = "sockmesh.io/cipher-suites"
	// OptionCurves lists the key exchange groups offered, which crypto/tls
	// orders by its own preference (Config.CurvePreferences):
	// X25519, CurveP256 (or P-256), CurveP384 (P-384), CurveP521 (P-521),
	// X25519MLKEM768, SecP256r1MLKEM768, SecP384r1MLKEM1024, MLKEM1024.
	// With TLS 1.2 the list also bounds the curves of the backend's ECDSA
	// certificate (RFC 8422): OpenSSL refuses a P-256 certificate to a
	// list without P-256 (proxy.TestInteropNative).
	OptionCurves = "sockmesh.io/curves"
	// OptionALPN lists the ALPN protocol IDs to offer (e.g. "h2,http/1.1"),
	// in preference order: a connection offers those of them it can speak
	// (an HTTP/1.1 request's, http/1.1), or the whole list when it speaks
	// none of them (opaque TCP).
	OptionALPN = "sockmesh.io/alpn"
)

const optionPrefix = "sockmesh.io/"

// Limits of BackendTLSPolicySpec.Options (CRD MaxProperties, and
// AnnotationValue's MaxLength), checked again: a cluster's CRD may be of
// another version or channel than v1.7.0 experimental.
const (
	maxOptions        = 16
	maxOptionValueLen = 4096
)

// ApplyOptions checks BackendTLSPolicy options and sets the TLS fields
// they configure on t. It returns a Problem with reason Invalid naming
// every bad option; t is then partly set and must not be used.
func ApplyOptions(opts map[gwv1.AnnotationKey]gwv1.AnnotationValue, t *snapshot.TLS) *Problem {
	var errs []string
	bad := func(key gwv1.AnnotationKey, format string, args ...any) {
		errs = append(errs, fmt.Sprintf("options[%s] ", key)+fmt.Sprintf(format, args...))
	}
	keys := make([]gwv1.AnnotationKey, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	slices.Sort(keys) // messages in a stable order
	if len(opts) > maxOptions {
		errs = append(errs, fmt.Sprintf("options has %d entries, more than the %d allowed", len(opts), maxOptions))
	}
	for _, key := range keys {
		if len(opts[key]) > maxOptionValueLen {
			bad(key, "is longer than %d bytes", maxOptionValueLen)
			continue
		}
		val := strings.TrimSpace(string(opts[key]))
		switch key {
		case OptionMinTLSVersion, OptionMaxTLSVersion:
			v, ok := tlsVersion(val)
			if !ok {
				bad(key, "%q is not a supported TLS version (1.2 or 1.3)", val)
			} else if key == OptionMinTLSVersion {
				t.MinVersion = v
			} else {
				t.MaxVersion = v
			}
		case OptionCipherSuites:
			for _, name := range list(val) {
				id, err := cipherSuite(name)
				if err != "" {
					bad(key, "%s", err)
					continue
				}
				t.CipherSuites = append(t.CipherSuites, id)
			}
			if len(list(val)) == 0 {
				bad(key, "is empty")
			}
		case OptionCurves:
			for _, name := range list(val) {
				id, ok := curve(name)
				if !ok {
					bad(key, "%q is not a supported key exchange group", name)
					continue
				}
				t.Curves = append(t.Curves, id)
			}
			if len(list(val)) == 0 {
				bad(key, "is empty")
			}
		case OptionALPN:
			for _, p := range list(val) {
				if len(p) > 255 {
					bad(key, "protocol ID %.16q... is longer than 255 bytes", p)
					continue
				}
				if slices.Contains(t.ALPN, p) {
					bad(key, "protocol ID %q is listed twice", p)
					continue
				}
				t.ALPN = append(t.ALPN, p)
			}
			if len(list(val)) == 0 {
				bad(key, "is empty")
			}
		default:
			if !strings.Contains(string(key), "/") {
				bad(key, "is unprefixed: Gateway API reserves such keys for options it defines, and it defines none sockmesh knows")
			} else if strings.HasPrefix(strings.ToLower(string(key)), optionPrefix) {
				bad(key, "is not an option sockmesh knows (%s, %s, %s, %s, %s)",
					OptionMinTLSVersion, OptionMaxTLSVersion, OptionCipherSuites, OptionCurves, OptionALPN)
			}
		}
	}
	if t.MinVersion != 0 && t.MaxVersion != 0 && t.MaxVersion < t.MinVersion {
		bad(OptionMaxTLSVersion, "is below %s", OptionMinTLSVersion)
	}
	if t.MinVersion == tls.VersionTLS13 && len(t.CipherSuites) > 0 {
		bad(OptionCipherSuites, "has no effect: TLS 1.3 cipher suites are not configurable and %s is 1.3", OptionMinTLSVersion)
	}
	if t.MaxVersion == tls.VersionTLS12 && len(t.Curves) > 0 && !slices.ContainsFunc(t.Curves, isECDHE) &&
		(len(t.CipherSuites) == 0 || !slices.ContainsFunc(t.CipherSuites, rsaKeyExchange)) {
		bad(OptionCurves, "lists only ML-KEM groups, which TLS 1.3 alone uses, and %s is 1.2: no handshake could agree on a key", OptionMaxTLSVersion)
	}
	if len(errs) > 0 {
		return &Problem{Reason: ReasonInvalid, Message: strings.Join(errs, "; ")}
	}
	return nil
}

func list(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func tlsVersion(s string) (uint16, bool) {
	switch strings.TrimPrefix(s, "TLSv") {
	case "1.2":
		return tls.VersionTLS12, true
	case "1.3":
		return tls.VersionTLS13, true
	}
	return 0, false
}

func cipherSuite(name string) (uint16, string) {
	for _, cs := range tls.CipherSuites() {
		if cs.Name != name {
			continue
		}
		if !slices.Contains(cs.SupportedVersions, tls.VersionTLS12) {
			return 0, fmt.Sprintf("%s is a TLS 1.3 suite; crypto/tls does not let TLS 1.3 suites be configured", name)
		}
		return cs.ID, ""
	}
	for _, cs := range tls.InsecureCipherSuites() {
		if cs.Name == name {
			return 0, fmt.Sprintf("%s is insecure and refused", name)
		}
	}
	return 0, fmt.Sprintf("%q is not a cipher suite crypto/tls knows", name)
}

// The groups crypto/tls implements: ECDHE curves, which TLS 1.2 can use
// too, and the ML-KEM groups, hybrid or not, which only TLS 1.3 can.
var (
	ecdheCurves = []tls.CurveID{tls.X25519, tls.CurveP256, tls.CurveP384, tls.CurveP521}
	kemCurves   = []tls.CurveID{tls.X25519MLKEM768, tls.SecP256r1MLKEM768, tls.SecP384r1MLKEM1024, tls.MLKEM1024}
)

// curve finds a group by its CurveID.String, or P-256's other spellings.
func curve(name string) (tls.CurveID, bool) {
	switch strings.ToUpper(name) {
	case "P-256", "P256":
		return tls.CurveP256, true
	case "P-384", "P384":
		return tls.CurveP384, true
	case "P-521", "P521":
		return tls.CurveP521, true
	}
	for _, c := range slices.Concat(ecdheCurves, kemCurves) {
		if strings.EqualFold(c.String(), name) {
			return c, true
		}
	}
	return 0, false
}

func isECDHE(c tls.CurveID) bool { return slices.Contains(ecdheCurves, c) }

// rsaKeyExchange reports whether suite id agrees its key without a group
// (TLS_RSA_WITH_*).
func rsaKeyExchange(id uint16) bool {
	return strings.HasPrefix(tls.CipherSuiteName(id), "TLS_RSA_")
}
