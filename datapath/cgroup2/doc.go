// Package cgroup2 finds the cgroup v2 hierarchy from /proc/self/mountinfo,
// and the cgroup v2 path of a process; it walks the cgroups below one,
// bounded and tolerating cgroups removed meanwhile.
//
// On a unified host the hierarchy is at /sys/fs/cgroup; on a hybrid one
// (systemd with cgroup v1 controllers) it is at /sys/fs/cgroup/unified. The
// datapath attaches its programs at the root of this hierarchy by default.
//
// It must not create, move into or remove cgroups.
package cgroup2
