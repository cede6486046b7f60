package refgrant_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/internal/refgrant"
)

func grant(namespace string, from gwv1.ReferenceGrantFrom, to gwv1.ReferenceGrantTo) *gwv1.ReferenceGrant {
	return &gwv1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "g"},
		Spec:       gwv1.ReferenceGrantSpec{From: []gwv1.ReferenceGrantFrom{from}, To: []gwv1.ReferenceGrantTo{to}},
	}
}

func TestAllows(t *testing.T) {
	const xgroup = "gateway.networking.x-k8s.io"
	from := refgrant.XBackend("apps")
	to := refgrant.To{Kind: "Secret", Namespace: "certs", Name: "client"}
	fromXBackends := gwv1.ReferenceGrantFrom{Group: xgroup, Kind: "XBackend", Namespace: "apps"}
	secrets := gwv1.ReferenceGrantTo{Kind: "Secret"}
	name := func(n string) *gwv1.ObjectName { o := gwv1.ObjectName(n); return &o }
	for _, tc := range []struct {
		name   string
		grants []*gwv1.ReferenceGrant
		want   bool
	}{
		{name: "no grant"},
		{name: "nil grant", grants: []*gwv1.ReferenceGrant{nil}},
		{name: "every secret", grants: []*gwv1.ReferenceGrant{grant("certs", fromXBackends, secrets)}, want: true},
		{name: "this secret by name", grants: []*gwv1.ReferenceGrant{grant("certs", fromXBackends, gwv1.ReferenceGrantTo{Kind: "Secret", Name: name("client")})}, want: true},
		{name: "another secret by name", grants: []*gwv1.ReferenceGrant{grant("certs", fromXBackends, gwv1.ReferenceGrantTo{Kind: "Secret", Name: name("other")})}},
		{name: "grant in the referrer's namespace", grants: []*gwv1.ReferenceGrant{grant("apps", fromXBackends, secrets)}},
		{name: "another referring namespace", grants: []*gwv1.ReferenceGrant{grant("certs", gwv1.ReferenceGrantFrom{Group: xgroup, Kind: "XBackend", Namespace: "other"}, secrets)}},
		{name: "another referring kind", grants: []*gwv1.ReferenceGrant{grant("certs", gwv1.ReferenceGrantFrom{Group: gwv1.GroupName, Kind: "HTTPRoute", Namespace: "apps"}, secrets)}},
		{name: "another referring group", grants: []*gwv1.ReferenceGrant{grant("certs", gwv1.ReferenceGrantFrom{Group: gwv1.GroupName, Kind: "XBackend", Namespace: "apps"}, secrets)}},
		{name: "another referent kind", grants: []*gwv1.ReferenceGrant{grant("certs", fromXBackends, gwv1.ReferenceGrantTo{Kind: "ConfigMap"})}},
		{name: "another referent group", grants: []*gwv1.ReferenceGrant{grant("certs", fromXBackends, gwv1.ReferenceGrantTo{Group: "example.com", Kind: "Secret"})}},
		{name: "second grant allows", grants: []*gwv1.ReferenceGrant{grant("certs", fromXBackends, gwv1.ReferenceGrantTo{Kind: "ConfigMap"}), grant("certs", fromXBackends, secrets)}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refgrant.Allows(tc.grants, from, to); got != tc.want {
				t.Errorf("Allows(%s, %+v, %+v) = %v, want %v", tc.name, from, to, got, tc.want)
			}
		})
	}
}
