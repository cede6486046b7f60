package tlsvalidation

import (
	"crypto/tls"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// ClientCertificate resolves an XBackend's clientCertificateRef in
// namespace: a core Secret in the same namespace (cross-namespace
// references would need a ReferenceGrant, which sockmesh does not support)
// whose tls.crt and tls.key form a key pair. The Problem's reason is
// InvalidKind, RefNotPermitted or InvalidCertificateRef; its message never
// contains key material.
func ClientCertificate(ref *gwv1.SecretObjectReference, namespace string, objs Objects) (certPEM, keyPEM string, p *Problem) {
	if ref == nil {
		return "", "", &Problem{Reason: ReasonInvalidCertificateRef, Message: "clientCertificateRef is not set"}
	}
	group, kind := "", "Secret"
	if ref.Group != nil {
		group = string(*ref.Group)
	}
	if ref.Kind != nil {
		kind = string(*ref.Kind)
	}
	if group != "" || kind != "Secret" {
		return "", "", &Problem{Reason: ReasonInvalidKind,
			Message: fmt.Sprintf("clientCertificateRef %s %s (group %q): only core Secrets are supported", kind, ref.Name, group)}
	}
	if ref.Namespace != nil && string(*ref.Namespace) != namespace && *ref.Namespace != "" {
		return "", "", &Problem{Reason: ReasonRefNotPermitted,
			Message: fmt.Sprintf("clientCertificateRef Secret %s/%s is in another namespace; sockmesh only uses Secrets in %s", *ref.Namespace, ref.Name, namespace)}
	}
	what := "clientCertificateRef Secret " + namespace + "/" + string(ref.Name)
	s := objs.Secret(namespace, string(ref.Name))
	if s == nil {
		return "", "", &Problem{Reason: ReasonInvalidCertificateRef, Message: what + ": not found"}
	}
	crt, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if len(crt) == 0 || len(key) == 0 {
		return "", "", &Problem{Reason: ReasonInvalidCertificateRef,
			Message: fmt.Sprintf("%s: needs keys %s and %s", what, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)}
	}
	// X509KeyPair checks that the key matches the leaf certificate. Its
	// errors describe PEM structure, never key bytes.
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return "", "", &Problem{Reason: ReasonInvalidCertificateRef, Message: fmt.Sprintf("%s: not a valid key pair: %v", what, err)}
	}
	return string(crt), string(key), nil
}
