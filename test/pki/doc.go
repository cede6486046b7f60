// Package pki issues throwaway certificate authorities and certificates for
// tests, end-to-end scenarios and benchmarks: a CA, server leaves with DNS,
// IP and URI (SPIFFE) subjectAltNames, client leaves for mutual TLS (with
// an Organization, which Kubernetes reads as the user's groups), and token
// signing key pairs such as kube-apiserver's service-account key.
//
// Keys are ECDSA P-256, the kind clusters commonly use. It must never be used
// for anything but tests: keys live in memory and in files the caller chooses,
// with no protection.
package pki
