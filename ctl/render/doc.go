// Package render prints sockmeshctl's answers: as a table (the default,
// kubectl-like: a summary table, then indented details) or as YAML or JSON
// of the same data, for scripts.
//
// Every table is a function of its data alone (ages are computed against
// the time the agent answered, never the local clock), so output is
// golden-tested. It must not fetch anything.
package render
