// Package leader elects the one agent in the cluster that writes: status
// and the Services sockmesh generates. It campaigns for a coordination.k8s.io
// Lease with client-go's leaderelection and runs the caller's work for each
// term it wins, cancelling that work's context the moment the lease is lost.
//
// It must not write anything itself beyond the Lease, and it never runs two
// terms' work at once.
package leader
