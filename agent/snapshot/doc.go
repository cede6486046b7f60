// Package snapshot defines the immutable, versioned table that the control
// plane hands to the data planes: which Service addresses are captured, which
// backend each one leads to (or, with GAMMA routes, how requests choose among
// backends), what the wire to that backend must look like (protocol, TLS),
// and which local pods are enrolled.
//
// It is the one contract between agent/translate (which builds a Snapshot from
// Kubernetes objects) and datapath/ and userspace-proxy/ (which consume it).
// It must stay free of client-go and Gateway API types: consumers import only
// this package and the standard library.
//
// A Snapshot is built once by New, never mutated afterwards, and published by
// atomic pointer swap. A connection keeps the Snapshot it started with.
package snapshot
