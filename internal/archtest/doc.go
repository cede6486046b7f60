// Package archtest holds tests that guard the project's shape: the import
// direction between the control plane and the data planes, and that every
// package says what it is for. It has no non-test code.
package archtest
