package translate

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// An EndpointSelector XBackend is backed by a headless Service that
// sockmesh creates, as the API's implementer notes suggest until the
// upstream EndpointSelector resource exists (KEP-6116): named with
// generateName "<xbackend>-" (selectorServiceGenerateName) so no one
// relies on its DNS name, clusterIP
// None, selector = matchLabels, one port whose targetPort is port.number,
// and a controller ownerReference to the XBackend so it goes with it. The
// EndpointSlice controller then does the selecting; the pods are dialled
// at port.number (selectedEndpoints). The Service is wanted
// while the XBackend's selector and port are valid, also when the
// XBackend is invalid for another reason (evalXBackend).

// maxMatchLabels is the CRD's maxProperties of endpointSelector.matchLabels.
const maxMatchLabels = 64

// selectorProblem checks matchLabels the way the CRD does.
func selectorProblem(labels map[gwv1.LabelKey]gwv1.LabelValue) string {
	switch {
	case len(labels) == 0:
		return "endpointSelector.matchLabels must not be empty"
	case len(labels) > maxMatchLabels:
		return fmt.Sprintf("endpointSelector.matchLabels has %d entries; at most %d", len(labels), maxMatchLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if errs := validation.IsQualifiedName(string(k)); len(errs) > 0 {
			return fmt.Sprintf("endpointSelector.matchLabels key %q: %s", k, errs[0])
		}
		if errs := validation.IsValidLabelValue(string(labels[k])); len(errs) > 0 {
			return fmt.Sprintf("endpointSelector.matchLabels[%s] value %q: %s", k, labels[k], errs[0])
		}
	}
	return ""
}

// selectorEndpoints records the Service the XBackend needs in
// Result.EndpointSelectorServices and returns the endpoints of the one
// that exists. A Service listed with a Name is to be updated in place; one
// without is to be created.
func (t *translator) selectorEndpoints(xb *gwxv1alpha1.XBackend) []snapshot.Endpoint {
	existing := t.generatedService(xb)
	want := desiredSelectorService(xb)
	if existing == nil {
		t.selectorServices = append(t.selectorServices, want)
		return nil
	}
	want.Name = existing.Name
	t.selectorServices = append(t.selectorServices, want)
	return t.selectedEndpoints(existing, uint16(xb.Spec.Port.Number))
}

// selectedEndpoints lists the pods in the EndpointSlices of svc, the
// generated Service, each at port: the XBackend's port.number, "which
// endpoint port to connect to". The slices' own port is the Service's
// targetPort, which trails a change of port.number (the Service is
// updated, then its slices) or, in a Service from manifests, may be
// another number or a name; the pods they list are the selected ones all
// the same. Topology hints play no part: the API gives the Service's
// trafficDistribution no role.
func (t *translator) selectedEndpoints(svc *corev1.Service, port uint16) []snapshot.Endpoint {
	hinted := t.hintedEndpoints(svc.Namespace, svc.Name, func(*discoveryv1.EndpointSlice) (uint16, bool) { return port, true })
	out := make([]snapshot.Endpoint, len(hinted))
	for i, h := range hinted {
		out[i] = h.Endpoint
	}
	return out
}

// generatedService finds the Service sockmesh generated for xb: in its
// namespace, labelled LabelXBackend, and owned by it. Should a race have
// made two, the older is used; the writer removes the other, which
// Result no longer lists.
func (t *translator) generatedService(xb *gwxv1alpha1.XBackend) *corev1.Service {
	var found []*corev1.Service
	for _, s := range t.services {
		if s.Namespace != xb.Namespace || s.Labels[LabelXBackend] != xbackendLabelValue(xb.Name) {
			continue
		}
		if slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return ownedBy(o, xb) }) {
			found = append(found, s)
		}
	}
	if len(found) == 0 {
		return nil
	}
	return slices.MinFunc(found, olderFirst)
}

func ownedBy(o metav1.OwnerReference, xb *gwxv1alpha1.XBackend) bool {
	return o.Kind == "XBackend" && o.Name == xb.Name && o.Controller != nil && *o.Controller &&
		strings.HasPrefix(o.APIVersion, gwxv1alpha1.GroupName+"/") &&
		(xb.UID == "" || o.UID == xb.UID)
}

// xbackendLabelValue is the LabelXBackend value for an XBackend: its name,
// or, for names longer than a label value may be, a stable hash of it.
func xbackendLabelValue(name string) string {
	if len(validation.IsValidLabelValue(name)) == 0 {
		return name
	}
	return "sha256-" + shortHash(name)
}

// selectorServiceGenerateName derives the generated Service's generateName
// from an XBackend name. The API server refuses a Service whose
// generateName is not a DNS-1035 label prefix (a letter first, no dots, at
// most 63 characters), while an XBackend name is a DNS subdomain: the
// Service of "api.v2", "2fa" or a long name was never created, and such an
// XBackend never had endpoints.
func selectorServiceGenerateName(name string) string {
	prefix := []byte(strings.ToLower(name))
	for i, c := range prefix {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			prefix[i] = '-'
		}
	}
	if len(prefix) == 0 || prefix[0] < 'a' || prefix[0] > 'z' {
		prefix = append([]byte("xb-"), prefix...)
	}
	// The API server keeps 58 characters of a generateName before its 5
	// random ones; keep what it keeps, dash included.
	return string(prefix[:min(len(prefix), 57)]) + "-"
}

func desiredSelectorService(xb *gwxv1alpha1.XBackend) *corev1.Service {
	selector := map[string]string{}
	for k, v := range xb.Spec.EndpointSelector.MatchLabels {
		selector[string(k)] = string(v)
	}
	port := int32(xb.Spec.Port.Number)
	controller := true
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: selectorServiceGenerateName(xb.Name),
			Namespace:    xb.Namespace,
			Labels:       map[string]string{LabelXBackend: xbackendLabelValue(xb.Name)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: gwxv1alpha1.GroupVersion.String(),
				Kind:       "XBackend",
				Name:       xb.Name,
				UID:        xb.UID,
				Controller: &controller,
			}},
		},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: corev1.ClusterIPNone,
			Selector:  selector,
			Ports: []corev1.ServicePort{{
				Protocol:   corev1.ProtocolTCP,
				Port:       port,
				TargetPort: intstr.FromInt32(port),
			}},
		},
	}
}
