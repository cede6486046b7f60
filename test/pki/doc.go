// Package pki issues throwaway certificate authorities and certificates for
// tests, end-to-end scenarios and benchmarks: a CA, server leaves with DNS,
// IP and URI (SPIFFE) subjectAltNames, and client leaves for mutual TLS.
//
// Keys are ECDSA P-256, the kind clusters commonly use. It must never be used
// for anything but tests: keys live in memory and in files the caller chooses,
// with no protection.
package pki
