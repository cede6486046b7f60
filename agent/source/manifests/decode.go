package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/source/manifests/crdschema"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// Decoder decodes manifests. It is safe for concurrent use.
type Decoder struct {
	decoder runtime.Decoder
	crds    *crdschema.Set // nil: objects are returned as written, unchecked
}

// NewDecoder returns a Decoder that knows the client-go and Gateway API
// v1.7.0 (standard and experimental) types, and admits each object as an
// API server with the v1.7.0 experimental CRDs would (see the package
// comment).
func NewDecoder() (*Decoder, error) {
	d, err := NewUncheckedDecoder()
	if err != nil {
		return nil, err
	}
	if d.crds, err = crdschema.Embedded(); err != nil {
		return nil, fmt.Errorf("load gateway api crds: %w", err)
	}
	return d, nil
}

// NewUncheckedDecoder returns a Decoder that returns Gateway API objects as
// written: no CRD defaults applied, nothing refused by the CRDs' schemas
// and rules or by the API server's metadata rules. It is for tests of what translate makes of objects that a
// cluster with other CRDs (another version or channel) could serve.
func NewUncheckedDecoder() (*Decoder, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, gwv1.Install, gwxv1alpha1.Install} {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("build manifest scheme: %w", err)
		}
	}
	// ReferenceGrant is served as v1 and v1beta1 with one schema; manifests
	// written for older clusters use v1beta1. Decode returns v1 for both.
	// Other v1beta1 kinds stay unknown: translate reads their v1 form only.
	beta := schema.GroupVersion{Group: gwv1beta1.GroupName, Version: "v1beta1"}
	scheme.AddKnownTypes(beta, &gwv1beta1.ReferenceGrant{}, &gwv1beta1.ReferenceGrantList{})
	metav1.AddToGroupVersion(scheme, beta)
	return &Decoder{decoder: serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()}, nil
}

// Decode reads every document in r and returns the objects, in order. It
// stops at the first bad document; the error names it by its 1-based
// position in the stream.
func (d *Decoder) Decode(r io.Reader) ([]runtime.Object, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var out []runtime.Object
	for n := 1; ; n++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read document %d: %w", n, err)
		}
		if isEmpty(doc) {
			continue
		}
		objs, err := d.decodeDocument(doc, 0)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		out = append(out, objs...)
	}
}

// isEmpty reports whether a document holds only comments, whitespace and
// document markers.
func isEmpty(doc []byte) bool {
	for line := range strings.Lines(string(doc)) {
		line = strings.TrimSpace(line)
		if line != "" && line != "---" && line != "..." && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

// maxListDepth bounds how deep Lists may nest in a document. Each level
// decodes its items' bytes again, so unbounded nesting made a document's
// cost grow with the square of its size: a 130 KB file of Lists nested
// 3,000 deep took 4 s, and JSON allows 10,000 levels.
const maxListDepth = 8

// decodeDocument decodes doc, a List's items too; depth is how many Lists
// hold doc.
func (d *Decoder) decodeDocument(doc []byte, depth int) ([]runtime.Object, error) {
	obj, gvk, err := d.decodeObject(doc)
	if err != nil {
		return nil, err
	}
	if list, ok := obj.(*corev1.List); ok {
		if depth == maxListDepth {
			return nil, fmt.Errorf("a List inside %d Lists: at most %d may nest", depth, maxListDepth)
		}
		var out []runtime.Object
		for i, item := range list.Items {
			objs, err := d.decodeDocument(bytes.TrimSpace(item.Raw), depth+1)
			if err != nil {
				return nil, fmt.Errorf("items[%d]: %w", i, err)
			}
			out = append(out, objs...)
		}
		return out, nil
	}
	if !Supported(obj) {
		return nil, fmt.Errorf("%s is not a kind sockmesh reads", kindOf(gvk))
	}
	if d.crds == nil {
		return []runtime.Object{obj}, nil
	}
	switch {
	case d.crds.Has(*gvk):
		if obj, err = d.admit(doc, *gvk, obj); err != nil {
			return nil, err
		}
	case d.crds.HasGroup(gvk.Group):
		// A kind read without its CRD would go unchecked: refuse it.
		return nil, fmt.Errorf("%s: no CRD of sockmesh's serves %s", Key(obj), gvk.GroupVersion())
	}
	if err := validateMetadata(obj); err != nil {
		return nil, err
	}
	return []runtime.Object{obj}, nil
}

// decodeObject decodes doc into its typed object, normalized; a v1beta1
// ReferenceGrant is returned as v1.
func (d *Decoder) decodeObject(doc []byte) (runtime.Object, *schema.GroupVersionKind, error) {
	obj, gvk, err := d.decoder.Decode(doc, nil, nil)
	if err != nil {
		return nil, gvk, describe(err, gvk)
	}
	if g, ok := obj.(*gwv1beta1.ReferenceGrant); ok {
		obj = referenceGrantV1(g)
	}
	normalize(obj)
	return obj, gvk, nil
}

func describe(err error, gvk *schema.GroupVersionKind) error {
	if gvk != nil && gvk.Kind != "" {
		return fmt.Errorf("decode %s: %w", kindOf(gvk), err)
	}
	return fmt.Errorf("decode: %w", err)
}

func kindOf(gvk *schema.GroupVersionKind) string {
	if gvk == nil {
		return "object"
	}
	return fmt.Sprintf("kind %s (apiVersion %s)", gvk.Kind, gvk.GroupVersion())
}

// referenceGrantV1 is g as the v1 API serves it (same schema).
func referenceGrantV1(g *gwv1beta1.ReferenceGrant) *gwv1.ReferenceGrant {
	out := gwv1.ReferenceGrant(*g)
	out.APIVersion = gwv1.GroupVersion.String()
	return &out
}

// normalize applies what kubectl apply and the API server would, and
// translate relies on: a namespace for namespaced objects, and a Secret's
// stringData moved into data.
func normalize(obj runtime.Object) {
	if m, ok := obj.(metav1.Object); ok && namespaced(obj) && m.GetNamespace() == "" {
		m.SetNamespace(metav1.NamespaceDefault)
	}
	if s, ok := obj.(*corev1.Secret); ok && len(s.StringData) > 0 {
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		for k, v := range s.StringData {
			s.Data[k] = []byte(v)
		}
		s.StringData = nil
	}
}

func namespaced(obj runtime.Object) bool {
	switch obj.(type) {
	case *corev1.Namespace, *certificatesv1.ClusterTrustBundle, *gwxv1alpha1.XMesh:
		return false
	}
	return true
}

// Supported reports whether obj is of a kind translate.Input holds.
func Supported(obj runtime.Object) bool {
	return Add(&translate.Input{}, obj) == nil
}

// Add appends obj to the list of in that holds its kind.
func Add(in *translate.Input, obj runtime.Object) error {
	switch o := obj.(type) {
	case *corev1.Service:
		in.Services = append(in.Services, o)
	case *discoveryv1.EndpointSlice:
		in.EndpointSlices = append(in.EndpointSlices, o)
	case *corev1.Namespace:
		in.Namespaces = append(in.Namespaces, o)
	case *corev1.Pod:
		in.Pods = append(in.Pods, o)
	case *corev1.ConfigMap:
		in.ConfigMaps = append(in.ConfigMaps, o)
	case *corev1.Secret:
		in.Secrets = append(in.Secrets, o)
	case *certificatesv1.ClusterTrustBundle:
		in.ClusterTrustBundles = append(in.ClusterTrustBundles, o)
	case *gwv1.BackendTLSPolicy:
		in.BackendTLSPolicies = append(in.BackendTLSPolicies, o)
	case *gwv1.HTTPRoute:
		in.HTTPRoutes = append(in.HTTPRoutes, o)
	case *gwv1.GRPCRoute:
		in.GRPCRoutes = append(in.GRPCRoutes, o)
	case *gwxv1alpha1.XBackend:
		in.XBackends = append(in.XBackends, o)
	case *gwxv1alpha1.XBackendTrafficPolicy:
		in.XBackendTrafficPolicies = append(in.XBackendTrafficPolicies, o)
	case *gwxv1alpha1.XMesh:
		in.XMeshes = append(in.XMeshes, o)
	case *gwv1.ReferenceGrant:
		in.ReferenceGrants = append(in.ReferenceGrants, o)
	default:
		return fmt.Errorf("%T is not a kind translate reads", obj)
	}
	return nil
}

// Key identifies an object among those of its kind, for finding duplicates:
// "Kind namespace/name" (no namespace for cluster-scoped kinds).
func Key(obj runtime.Object) string {
	kind := fmt.Sprintf("%T", obj)
	kind = kind[strings.LastIndex(kind, ".")+1:]
	m, ok := obj.(metav1.Object)
	if !ok {
		return kind
	}
	if m.GetNamespace() == "" {
		return kind + " " + m.GetName()
	}
	return kind + " " + m.GetNamespace() + "/" + m.GetName()
}
