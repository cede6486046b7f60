// Package refgrant answers whether Gateway API ReferenceGrants let an
// object refer to one in another namespace (GEP-709). translate asks it
// before it uses a cross-namespace reference, and the Kubernetes source
// and sockmeshctl describe ask it before they read a referenced Secret,
// so that a reference no grant allows makes nobody read the Secret.
//
// It only matches grants it is given; it must not fetch or watch them.
package refgrant
