// Package mountinfo reads the calling process's mount table
// (/proc/self/mountinfo): each mount's ID, mount point, filesystem type and
// whether it propagates to a peer group (shared). Tests and the cluster
// tier read it to check and undo the mounts they made (bpffs above all).
//
// It only reads; it must not mount or unmount anything.
package mountinfo
