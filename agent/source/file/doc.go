// Package file is the config source that reads a directory of Kubernetes
// YAML or JSON manifests (package manifests) instead of an API server: the
// embedded default on a machine without a cluster, the demo, and fast
// tests — the idea of Envoy Gateway's standalone mode.
//
// It reads the directory's *.yaml, *.yml and *.json files, not its
// subdirectories (as kubectl apply -f dir does); names starting with "." are
// skipped, which also skips the ..data links of a mounted ConfigMap while
// their targets are read through the file links. It watches the directory
// with fsnotify, coalesces a burst of events into one reload (Config.Debounce)
// and signals Changed only when the objects changed. It also re-reads every
// Config.Resync, which covers lost events and a directory replaced wholesale.
//
// A file that does not parse, or holds an object the API server would
// refuse (package manifests admits each as the v1.7.0 experimental CRDs and
// the API server's metadata rules do), is reported (file name and reason:
// Errors, the log, and a metric) and its last good content stays in place,
// all of its objects; the rest of the directory still updates. So is a
// file over 32 MiB, which is not read, and one that cannot be read (a link
// loop); a removed file, or a dangling link, takes its objects with it.
// Nothing a file holds makes the source stop. An object written in a
// version its CRD deprecates is served, and logged once with the API
// server's warning, as kubectl apply prints it. An object defined in two
// files is taken from the first file by name, and the duplicate is
// reported.
//
// A file is read as it is when the burst's reload comes, so one rewritten
// in place by a writer slower than Debounce may be read half-written. A
// half that does not parse keeps the last good content; an emptied file (a
// shell's "> file" empties it before its writer writes) keeps its objects,
// reported, until it has stayed empty for Resync; a half that parses
// (documents cut at a separator) is served until the write ends. Files
// replaced by rename (an editor's safe save, a mounted ConfigMap) are
// never seen half-written.
//
// It implements agent/source.Source. It only reads: it never writes the
// directory, translates, or sets Input.Now, Node or Resolved.
package file
