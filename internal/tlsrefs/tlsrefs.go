package tlsrefs

import (
	"cmp"
	"slices"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/internal/refgrant"
)

// Ref names a referenced ConfigMap, or Secret when Secret is set.
type Ref struct {
	Secret    bool
	Namespace string
	Name      string
}

// Kind is the referenced object's kind: ConfigMap or Secret.
func (r Ref) Kind() string {
	if r.Secret {
		return "Secret"
	}
	return "ConfigMap"
}

// Compare orders references by namespace, name, then kind (ConfigMap
// first): the order Of returns, for slices.BinarySearchFunc.
func Compare(a, b Ref) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Kind(), b.Kind()))
}

// Of lists, sorted by Compare and without duplicates, the ConfigMaps and
// Secrets these objects reference: core-group CA certificate references of
// BackendTLSPolicies and XBackends, and XBackend client certificates (a
// core Secret in the XBackend's namespace, or in another one whose
// ReferenceGrant among grants allows it: one no grant allows is not read).
func Of(policies []*gwv1.BackendTLSPolicy, xbackends []*gwxv1alpha1.XBackend, grants []*gwv1.ReferenceGrant) []Ref {
	var refs []Ref
	addCARefs := func(namespace string, caRefs []gwv1.LocalObjectReference) {
		for _, r := range caRefs {
			if r.Group == "" && (r.Kind == "ConfigMap" || r.Kind == "Secret") {
				refs = append(refs, Ref{Secret: r.Kind == "Secret", Namespace: namespace, Name: string(r.Name)})
			}
		}
	}
	for _, p := range policies {
		addCARefs(p.Namespace, p.Spec.Validation.CACertificateRefs)
	}
	for _, xb := range xbackends {
		tls := xb.Spec.TLS
		if tls == nil {
			continue
		}
		if tls.Validation != nil {
			addCARefs(xb.Namespace, tls.Validation.CACertificateRefs)
		}
		if r := tls.ClientCertificateRef; r != nil && (r.Group == nil || *r.Group == "") && (r.Kind == nil || *r.Kind == "Secret") {
			ns := xb.Namespace
			if r.Namespace != nil && *r.Namespace != "" {
				ns = string(*r.Namespace)
			}
			if ns == xb.Namespace || refgrant.Allows(grants, refgrant.XBackend(xb.Namespace), refgrant.To{Kind: "Secret", Namespace: ns, Name: string(r.Name)}) {
				refs = append(refs, Ref{Secret: true, Namespace: ns, Name: string(r.Name)})
			}
		}
	}
	slices.SortFunc(refs, Compare)
	return slices.Compact(refs)
}
