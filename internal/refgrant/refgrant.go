package refgrant

import (
	"slices"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
)

// From is the referring object's group, kind and namespace.
type From struct {
	Group, Kind, Namespace string
}

// XBackend is an XBackend in namespace as a referrer: what a grant's from
// entry names to allow its clientCertificateRef.
func XBackend(namespace string) From {
	return From{Group: gwxv1alpha1.GroupName, Kind: "XBackend", Namespace: namespace}
}

// To is the referent: its group ("" for core), kind, namespace and name.
type To struct {
	Group, Kind, Namespace, Name string
}

// Allows reports whether one of grants lets from refer to to. Only a grant
// in the referent's namespace counts (the referent's owner consents there),
// so callers may pass every grant or only that namespace's. A grant's to
// entry without a name allows every object of its group and kind.
func Allows(grants []*gwv1.ReferenceGrant, from From, to To) bool {
	return slices.ContainsFunc(grants, func(g *gwv1.ReferenceGrant) bool {
		if g == nil || g.Namespace != to.Namespace {
			return false
		}
		return slices.ContainsFunc(g.Spec.From, func(f gwv1.ReferenceGrantFrom) bool {
			return string(f.Group) == from.Group && string(f.Kind) == from.Kind && string(f.Namespace) == from.Namespace
		}) && slices.ContainsFunc(g.Spec.To, func(t gwv1.ReferenceGrantTo) bool {
			return string(t.Group) == to.Group && string(t.Kind) == to.Kind && (t.Name == nil || *t.Name == "" || string(*t.Name) == to.Name)
		})
	})
}
