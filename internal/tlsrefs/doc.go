// Package tlsrefs lists the ConfigMaps and Secrets that translate may read
// for BackendTLSPolicies and XBackends: their CA certificate references
// and XBackend client certificates. The agent's Kubernetes source watches
// exactly these, and sockmeshctl describe gets exactly these, so both
// must take the list from here.
//
// CA certificate references never leave the referrer's namespace; a
// client certificate in another namespace is listed only when a
// ReferenceGrant there allows it (refgrant, as translate decides), so a
// reference no grant allows makes no one read that Secret. It only reads
// the objects it is given; it must not fetch, watch or judge them (a
// reference's validity is translate's to decide).
package tlsrefs
