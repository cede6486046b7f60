package tlsvalidation

import gwv1 "sigs.k8s.io/gateway-api/apis/v1"

// Condition reasons a Problem may carry, spelled as Gateway API spells them.
const (
	ReasonInvalid                 = string(gwv1.PolicyReasonInvalid)
	ReasonNoValidCACertificate    = string(gwv1.BackendTLSPolicyReasonNoValidCACertificate)
	ReasonInvalidCACertificateRef = string(gwv1.BackendTLSPolicyReasonInvalidCACertificateRef)
	ReasonInvalidKind             = string(gwv1.BackendTLSPolicyReasonInvalidKind)
	// ReasonCACertificateOutsideValidity is sockmesh's own ResolvedRefs
	// reason for a CA reference none of whose certificates is valid now:
	// the API asks for an implementation-specific reason when an
	// implementation checks expiry (BackendTLSPolicyValidation
	// caCertificateRefs).
	ReasonCACertificateOutsideValidity = "CACertificateOutsideValidity"
	// ReasonInvalidCertificateRef and ReasonRefNotPermitted are the
	// Gateway listener reasons for certificate references, reused for an
	// XBackend's clientCertificateRef.
	ReasonInvalidCertificateRef = string(gwv1.ListenerReasonInvalidCertificateRef)
	ReasonRefNotPermitted       = string(gwv1.ListenerReasonRefNotPermitted)
)
