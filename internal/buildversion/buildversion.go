// Package buildversion names the build a sockmesh binary reports (its
// version command, its User-Agent, sockmesh_build_info): the version the
// Makefile links in with -X main.version, else the module version that
// `go install module@version` records.
package buildversion

import "runtime/debug"

// Of returns linked, the binary's -X main.version, unless it is "dev" (no
// -X given) and the build info has a module version.
func Of(linked string) string {
	if linked != "dev" {
		return linked
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return linked
}
