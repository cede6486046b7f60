// Package bpffs makes sure a BPF filesystem is mounted where the datapath
// pins its programs, links and maps, so they outlive the process that loaded
// them.
//
// It must not pin or read anything itself, and it never mounts over a
// directory that holds files.
package bpffs
