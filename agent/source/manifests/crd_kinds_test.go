package manifests_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/test/pki"
)

// TestRefusedAsTheAPIServerRefuses: for each kind the file source reads,
// an object over one of the API server's limits — its metadata rules, and
// its rules for the fields translate reads, for core kinds, the v1.7
// experimental CRD's schema or CEL rules for Gateway API kinds — is refused by the real API server and by the decoder, which
// names the document, the object and the fields the API server names; the
// same object at the limit is accepted by both, so the limit is the one
// checked.
func TestRefusedAsTheAPIServerRefuses(t *testing.T) {
	const ns = "crd"
	env, dec := startCRDServer(t, ns)
	// Pods need their namespace's default ServiceAccount.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	if _, err := env.Kube.CoreV1().ServiceAccounts(ns).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	list := func(n int, item string) string {
		items := make([]string, n)
		for i := range items {
			items[i] = fmt.Sprintf(item, i)
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	head := func(apiVersion, kind, name string) string {
		return "apiVersion: " + apiVersion + "\nkind: " + kind + "\nmetadata: {name: " + name + ", namespace: crd}\n"
	}
	gw := func(kind string) string { return head("gateway.networking.k8s.io/v1", kind, "o") }
	x := func(kind string) string { return head("gateway.networking.x-k8s.io/v1alpha1", kind, "o") }
	label := func(n int) string { return "labels: {app: " + strings.Repeat("a", n) + "}" }
	api := `{group: "", kind: Service, name: api, port: 80}`
	ca, err := pki.NewCA("crd")
	if err != nil {
		t.Fatal(err)
	}
	bundle := strconv.Quote(string(ca.CertPEM))
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "leaf"})
	if err != nil {
		t.Fatal(err)
	}
	slice := func(addressType, address string, port int) string {
		return "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e, namespace: crd}\naddressType: " + addressType +
			"\nendpoints: [{addresses: [\"" + address + "\"]}]\nports: [{port: " + strconv.Itoa(port) + "}]"
	}
	xbackend := x("XBackend") + "spec: {type: ExternalHostname, externalHostname: {hostname: a.example.com}, port: {number: 443}, " +
		"tls: {mode: ServerOnly, validation: {hostname: a.example.com, wellKnownCACertificates: System, subjectAltNames: %s}}}"
	for _, tc := range []struct {
		kind     string
		refused  string
		accepted string
	}{
		// Core kinds: sockmesh reads their metadata (names, labels), and
		// the API server's rules for it are checked.
		{"Service", "apiVersion: v1\nkind: Service\nmetadata: {name: Api, namespace: crd}\nspec: {ports: [{port: 80}]}",
			"apiVersion: v1\nkind: Service\nmetadata: {name: 1api, namespace: crd}\nspec: {ports: [{port: 80}]}"},
		{"EndpointSlice", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e, namespace: crd, " + label(64) + "}\naddressType: IPv4\nendpoints: []",
			"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e, namespace: crd, " + label(63) + "}\naddressType: IPv4\nendpoints: []"},
		{"Namespace", "apiVersion: v1\nkind: Namespace\nmetadata: {name: Apps}", "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps}"},
		{"Pod", "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: crd, " + label(64) + "}\nspec: {containers: [{name: c, image: i}]}",
			"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: crd, " + label(63) + "}\nspec: {containers: [{name: c, image: i}]}"},
		{"ConfigMap", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ca_bundle, namespace: crd}", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ca-bundle, namespace: crd}"},
		{"Secret", "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: crd, annotations: {not a key: v}}",
			"apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: crd, annotations: {example.com/key: v}}"},
		{"ClusterTrustBundle", "apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b, " + label(64) + "}\nspec: {trustBundle: " + bundle + "}",
			"apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b, " + label(63) + "}\nspec: {trustBundle: " + bundle + "}"},
		{"ClusterTrustBundle name", "apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: \"example.com:other:b\"}\nspec: {signerName: example.com/signer, trustBundle: " + bundle + "}",
			"apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: \"example.com:signer:b\"}\nspec: {signerName: example.com/signer, trustBundle: " + bundle + "}"},
		// Core kinds: the fields translate reads, each checked with the
		// API server's rule (translate skipped or took them unannounced).
		{"Service port", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 65536}]}",
			"apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 65535}]}"},
		{"Service port 0", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 0}]}",
			"apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 1}]}"},
		{"Service protocol", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 80, protocol: QUIC}]}",
			"apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 80, protocol: SCTP}]}"},
		{"Service clusterIP", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}",
			"apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {clusterIP: None, ports: [{port: 80}]}"},
		{"EndpointSlice address family", slice("IPv4", "fd00::1", 80), slice("IPv4", "10.0.0.1", 80)},
		{"EndpointSlice address", slice("IPv6", "not-an-ip", 80), slice("IPv6", "fd00::1", 80)},
		{"EndpointSlice protocol", strings.Replace(slice("IPv4", "10.0.0.1", 80), "{port: 80}", "{port: 80, protocol: QUIC}", 1),
			strings.Replace(slice("IPv4", "10.0.0.1", 80), "{port: 80}", "{port: 80, protocol: UDP}", 1)},
		{"Service targetPort", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 80, targetPort: 65536}]}",
			"apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 80, targetPort: http-alt}]}"},
		{"Service targetPort name", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 80, targetPort: not_a_name}]}",
			"apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: crd}\nspec: {ports: [{port: 80, targetPort: 8080}]}"},
		{"EndpointSlice addressType", slice("IPv5", "10.0.0.1", 80), slice("FQDN", "a.example.com", 80)},
		{"ClusterTrustBundle no certificate", "apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b}\nspec: {trustBundle: not a certificate}",
			"apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b}\nspec: {trustBundle: " + bundle + "}"},
		{"ClusterTrustBundle leaf", "apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b}\nspec: {trustBundle: " + strconv.Quote(string(leaf.CertPEM)) + "}",
			"apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b}\nspec: {trustBundle: " + bundle + "}"},
		{"ClusterTrustBundle key", "apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b}\nspec: {trustBundle: " + strconv.Quote(string(ca.CertPEM)+string(leaf.KeyPEM)) + "}",
			"apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b}\nspec: {trustBundle: " + bundle + "}"},
		{"ClusterTrustBundle duplicate", "apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b}\nspec: {trustBundle: " + strconv.Quote(string(ca.CertPEM)+string(ca.CertPEM)) + "}",
			"apiVersion: certificates.k8s.io/v1\nkind: ClusterTrustBundle\nmetadata: {name: b}\nspec: {trustBundle: " + bundle + "}"},
		{"Secret kubernetes.io/tls", "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: crd}\ntype: kubernetes.io/tls\nstringData: {tls.key: k}",
			"apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: crd}\ntype: kubernetes.io/tls\nstringData: {tls.key: k, tls.crt: c}"},
		// Gateway API kinds: the CRD's limits.
		{"HTTPRoute", gw("HTTPRoute") + "spec: {parentRefs: [" + api + "], hostnames: " + list(17, "h%d.example.com") + "}",
			gw("HTTPRoute") + "spec: {parentRefs: [" + api + "], hostnames: " + list(16, "h%d.example.com") + "}"},
		{"GRPCRoute", gw("GRPCRoute") + "spec: {parentRefs: [" + api + "], rules: " + list(17, "{name: r%d}") + "}",
			gw("GRPCRoute") + "spec: {parentRefs: [" + api + "], rules: " + list(16, "{name: r%d}") + "}"},
		{"ReferenceGrant from", gw("ReferenceGrant") + "spec: {from: " + list(17, "{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: n%d}") + `, to: [{group: "", kind: Service}]}`,
			gw("ReferenceGrant") + "spec: {from: " + list(16, "{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: n%d}") + `, to: [{group: "", kind: Service}]}`},
		{"ReferenceGrant to", gw("ReferenceGrant") + "spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}], to: " + list(17, `{group: "", kind: Service, name: s%d}`) + "}",
			gw("ReferenceGrant") + "spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}], to: " + list(16, `{group: "", kind: Service, name: s%d}`) + "}"},
		{"ReferenceGrant v1beta1", strings.Replace(gw("ReferenceGrant"), "/v1\n", "/v1beta1\n", 1) + "spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}], to: " + list(17, `{group: "", kind: Service, name: s%d}`) + "}",
			strings.Replace(gw("ReferenceGrant"), "/v1\n", "/v1beta1\n", 1) + "spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other}], to: " + list(16, `{group: "", kind: Service, name: s%d}`) + "}"},
		{"BackendTLSPolicy", gw("BackendTLSPolicy") + "spec: {targetRefs: " + list(17, `{group: "", kind: Service, name: s%d}`) + ", validation: {hostname: a.example.com, wellKnownCACertificates: System}}",
			gw("BackendTLSPolicy") + "spec: {targetRefs: " + list(16, `{group: "", kind: Service, name: s%d}`) + ", validation: {hostname: a.example.com, wellKnownCACertificates: System}}"},
		{"XBackend", fmt.Sprintf(xbackend, list(6, "{type: Hostname, hostname: s%d.example.com}")), fmt.Sprintf(xbackend, list(5, "{type: Hostname, hostname: s%d.example.com}"))},
		{"XBackendTrafficPolicy", x("XBackendTrafficPolicy") + "spec: {targetRefs: " + list(17, `{group: "", kind: Service, name: s%d}`) + "}",
			x("XBackendTrafficPolicy") + "spec: {targetRefs: " + list(16, `{group: "", kind: Service, name: s%d}`) + "}"},
		// A CEL rule: sectionName or port must tell two references to one
		// parent apart.
		{"HTTPRoute CEL", gw("HTTPRoute") + `spec: {parentRefs: [{group: "", kind: Service, name: api}, {group: "", kind: Service, name: api}]}`,
			gw("HTTPRoute") + `spec: {parentRefs: [{group: "", kind: Service, name: api, port: 80}, {group: "", kind: Service, name: api, port: 81}]}`},
		{"XMesh", "apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XMesh\nmetadata: {name: m}\nspec: {controllerName: sockmesh.io/mesh-controller, description: " + strings.Repeat("é", 65) + "}",
			"apiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XMesh\nmetadata: {name: m}\nspec: {controllerName: sockmesh.io/mesh-controller, description: " + strings.Repeat("é", 64) + "}"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			refusedByBoth(t, env, dec, ns, tc.refused)
			if _, err := dec.Decode(strings.NewReader(tc.accepted)); err != nil {
				t.Errorf("Decode at the limit: %v", err)
			}
			createAccepted(t, env, ns, tc.accepted)
		})
	}
}
