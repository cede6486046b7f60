// Package tlsvalidation turns Gateway API backend TLS settings — a
// BackendTLSPolicyValidation (used by BackendTLSPolicy and by XBackend's
// tls.validation), BackendTLSPolicy options and an XBackend client
// certificate reference — into verified snapshot.TLS fields, or into the
// Gateway API condition reason and message that say why they cannot be used.
//
// It is the one place that resolves and parses CA bundles, subjectAltNames,
// TLS options and client key pairs, so BackendTLSPolicy and XBackend behave
// the same. Like translate, it is pure: the objects it may read arrive
// through Objects, and it never logs, dials or reads the clock. It must never
// put a private key in a message.
package tlsvalidation
