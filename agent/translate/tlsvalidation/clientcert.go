package tlsvalidation

import (
	"crypto/tls"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// ClientCert is a client key pair ClientCertificate resolved.
type ClientCert struct {
	// CertPEM and KeyPEM are the Secret's tls.crt and tls.key; empty when
	// there is a Problem.
	CertPEM, KeyPEM string
	// ChangesAt is the first instant after now at which the judgement of
	// the certificate's validity changes: its NotBefore while it is not yet
	// valid, the nanosecond after its NotAfter (RFC 5280 §4.1.2.5: the
	// period includes both) while it is valid. Zero when no time changes
	// the judgement: expired, or refused for something else.
	ChangesAt time.Time
}

// ClientCertificate resolves the clientCertificateRef of an XBackend in
// namespace: a core Secret whose tls.crt and tls.key form a key pair, with
// an unencrypted key and a certificate valid at now. The Secret is in
// namespace unless ref names another, which granted (the referrer's
// ReferenceGrant check) must allow: a SecretObjectReference's namespace
// "requires a ReferenceGrant in the referent namespace". The Problem's
// reason is InvalidKind, RefNotPermitted or InvalidCertificateRef; its
// message never contains key material.
func ClientCertificate(ref *gwv1.SecretObjectReference, namespace string, objs Objects, granted func(namespace, name string) bool, now time.Time) (ClientCert, *Problem) {
	if ref == nil {
		return ClientCert{}, &Problem{Reason: ReasonInvalidCertificateRef, Message: "clientCertificateRef is not set"}
	}
	group, kind := "", "Secret"
	if ref.Group != nil {
		group = string(*ref.Group)
	}
	if ref.Kind != nil {
		kind = string(*ref.Kind)
	}
	if group != "" || kind != "Secret" {
		return ClientCert{}, &Problem{Reason: ReasonInvalidKind,
			Message: fmt.Sprintf("clientCertificateRef %s %s (group %q): only core Secrets are supported", kind, ref.Name, group)}
	}
	what := "clientCertificateRef Secret " + namespace + "/" + string(ref.Name)
	if ref.Namespace != nil && *ref.Namespace != "" && string(*ref.Namespace) != namespace {
		other := string(*ref.Namespace)
		what = "clientCertificateRef Secret " + other + "/" + string(ref.Name)
		if !granted(other, string(ref.Name)) {
			return ClientCert{}, &Problem{Reason: ReasonRefNotPermitted,
				Message: fmt.Sprintf("%s: no ReferenceGrant in namespace %s allows references to it from namespace %s", what, other, namespace)}
		}
		namespace = other
	}
	s := objs.Secret(namespace, string(ref.Name))
	if s == nil {
		return ClientCert{}, &Problem{Reason: ReasonInvalidCertificateRef, Message: what + ": not found"}
	}
	crt, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if len(crt) == 0 || len(key) == 0 {
		return ClientCert{}, &Problem{Reason: ReasonInvalidCertificateRef,
			Message: fmt.Sprintf("%s: needs keys %s and %s", what, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)}
	}
	if encrypted(key) {
		return ClientCert{}, &Problem{Reason: ReasonInvalidCertificateRef,
			Message: fmt.Sprintf("%s: %s is encrypted, and encrypted keys are not supported (the proxy has no passphrase): store the key unencrypted", what, corev1.TLSPrivateKeyKey)}
	}
	// X509KeyPair checks that the key matches the leaf certificate. Its
	// errors describe PEM structure, never key bytes.
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return ClientCert{}, &Problem{Reason: ReasonInvalidCertificateRef, Message: fmt.Sprintf("%s: not a valid key pair: %v", what, err)}
	}
	// A backend refuses a certificate outside its validity (RFC 5280
	// §4.1.2.5), and the app would see only a failed handshake: say so
	// here, where the owner reads it. The caller judges again at ChangesAt.
	leaf := pair.Leaf
	switch {
	case now.Before(leaf.NotBefore):
		return ClientCert{ChangesAt: leaf.NotBefore}, &Problem{Reason: ReasonInvalidCertificateRef,
			Message: fmt.Sprintf("%s: the %s certificate is not valid before %s", what, corev1.TLSCertKey, leaf.NotBefore.UTC().Format(time.RFC3339))}
	case now.After(leaf.NotAfter):
		return ClientCert{}, &Problem{Reason: ReasonInvalidCertificateRef,
			Message: fmt.Sprintf("%s: the %s certificate expired at %s", what, corev1.TLSCertKey, leaf.NotAfter.UTC().Format(time.RFC3339))}
	}
	return ClientCert{CertPEM: string(crt), KeyPEM: string(key), ChangesAt: leaf.NotAfter.Add(time.Nanosecond)}, nil
}

// encrypted reports whether the first private key block of keyPEM is
// encrypted: labelled ENCRYPTED PRIVATE KEY, a legacy PEM block with an
// RFC 1421 Proc-Type header, or, whatever its label, PKCS #8's
// EncryptedPrivateKeyInfo (RFC 5958 §3; some tools label it plain
// PRIVATE KEY). Unlike X509KeyPair's parse error, that says what to change.
func encrypted(keyPEM []byte) bool {
	for {
		block, rest := pem.Decode(keyPEM)
		if block == nil {
			return false
		}
		if strings.HasSuffix(block.Type, "PRIVATE KEY") {
			return block.Type == "ENCRYPTED PRIVATE KEY" || strings.Contains(block.Headers["Proc-Type"], "ENCRYPTED") ||
				isEncryptedPrivateKeyInfo(block.Bytes)
		}
		keyPEM = rest
	}
}

// encryptedPrivateKeyInfo is RFC 5958's EncryptedPrivateKeyInfo. A
// PrivateKeyInfo (PKCS #8 in the clear) starts with its version, an
// INTEGER, where this starts with an AlgorithmIdentifier, a SEQUENCE; a
// PKCS #1 or SEC 1 key starts with an INTEGER too.
type encryptedPrivateKeyInfo struct {
	Algorithm     pkix.AlgorithmIdentifier
	EncryptedData []byte
}

// isEncryptedPrivateKeyInfo reports whether der is exactly one
// EncryptedPrivateKeyInfo.
func isEncryptedPrivateKeyInfo(der []byte) bool {
	var info encryptedPrivateKeyInfo
	rest, err := asn1.Unmarshal(der, &info)
	return err == nil && len(rest) == 0
}
