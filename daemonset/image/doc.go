// Package image writes the node images sockmesh ships and tests with: one
// layer holding static binaries, no base image, no shell, written as a
// docker-archive tarball that `ctr -n k8s.io images import` loads. It needs
// no Docker engine and no registry, which a node without internet access
// (and this project's CI) does not have.
//
// It must stay a pure file writer: it never talks to a container runtime or
// a registry, and it never builds the binaries it packs.
package image
