// Package cniconf installs sockmesh's chained CNI plugin on a node and
// removes it: the plugin's binary in the node's CNI bin directory, and its
// entry, last, in the plugin list of the network configuration the
// container runtime uses (the first file of the CNI conf directory by name,
// as libcni sorts them). The rest of that file is kept: other plugins'
// entries and every other field, with their values (the file is written
// back indented, its keys sorted). A single plugin's configuration (a
// .conf) becomes a .conflist of the same name listing it, as libcni reads
// a .conf, and becomes the .conf again at Uninstall.
//
// Chain is idempotent: a file that holds the entry as wanted is not
// written again (a runtime watching the directory reloads on writes), so
// that the agent may chain again and again, as a node's network plugin
// may rewrite its configuration without the entry.
// Files are replaced by rename, never written in place, so that the
// runtime never reads half of one.
//
// It must not talk to the agent or the runtime.
package cniconf
