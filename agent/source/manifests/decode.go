package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
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
	gwv1alpha3 "sigs.k8s.io/gateway-api/apis/v1alpha3"
	gwv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/source/manifests/crdschema"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// Decoder decodes manifests. It is safe for concurrent use.
type Decoder struct {
	decoder runtime.Decoder
	crds    *crdschema.Set // nil: objects are returned as written, unchecked
	// keepStatus: Gateway API objects keep (and have checked) their
	// status, rather than lose it as on create.
	keepStatus bool
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

// NewDecoderKeepingStatus returns a Decoder like NewDecoder's whose
// Gateway API objects keep their status, checked against their CRD's
// schema, where NewDecoder's lose it as on create: for test fixtures that
// stand for a cluster's objects, whose status controllers wrote.
func NewDecoderKeepingStatus() (*Decoder, error) {
	d, err := NewDecoder()
	if err != nil {
		return nil, err
	}
	d.keepStatus = true
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
	// The v1.7.0 CRDs serve ReferenceGrant and HTTPRoute as v1beta1 too,
	// BackendTLSPolicy as v1alpha3 too, each with its v1 schema; manifests
	// written for older clusters use them. Decode returns them as v1, as
	// the API server stores them. Other older kinds stay unknown.
	beta := schema.GroupVersion{Group: gwv1beta1.GroupName, Version: "v1beta1"}
	scheme.AddKnownTypes(beta, &gwv1beta1.ReferenceGrant{}, &gwv1beta1.ReferenceGrantList{}, &gwv1beta1.HTTPRoute{}, &gwv1beta1.HTTPRouteList{})
	metav1.AddToGroupVersion(scheme, beta)
	alpha3 := schema.GroupVersion{Group: gwv1alpha3.GroupName, Version: "v1alpha3"}
	scheme.AddKnownTypes(alpha3, &gwv1alpha3.BackendTLSPolicy{}, &gwv1alpha3.BackendTLSPolicyList{})
	metav1.AddToGroupVersion(scheme, alpha3)
	return &Decoder{decoder: serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()}, nil
}

// MaxDocumentBytes bounds a document, a List too: the body an API server
// takes in one request (k8s.io/apiserver's MaxRequestBodyBytes default),
// so that any object a cluster holds fits. Decoding allocates some 25
// times a document's size and takes up to 0.2 s a megabyte here.
const MaxDocumentBytes = 3 << 20

// Decode reads every document in r and returns the objects, in order. It
// stops at the first bad document; the error names it by its 1-based
// position in the stream.
func (d *Decoder) Decode(r io.Reader) ([]runtime.Object, error) {
	objs, _, err := d.DecodeWithWarnings(r)
	return objs, err
}

// Warning is what an API server would warn of, as kubectl prints it, on
// create of an object Decode returned: the version it was written in is
// one its CRD deprecates (BackendTLSPolicy v1alpha3).
type Warning struct {
	// Document is the object's 1-based position in the stream; Object
	// its Key.
	Document int
	Object   string
	// APIVersion is the version it was written in; Use the one to write
	// instead, as which it was returned.
	APIVersion, Use string
	// Text is the API server's warning.
	Text string
}

func (w Warning) String() string {
	return fmt.Sprintf("document %d: %s: %s", w.Document, w.Object, w.Text)
}

// DecodeWithWarnings is Decode, and returns what an API server would warn
// of for the objects (a NewUncheckedDecoder's none).
func (d *Decoder) DecodeWithWarnings(r io.Reader) ([]runtime.Object, []Warning, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var out decoded
	for n := 1; ; n++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out.objs, out.warnings, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read document %d: %w", n, err)
		}
		if isEmpty(doc) {
			continue
		}
		if len(doc) > MaxDocumentBytes {
			return nil, nil, fmt.Errorf("document %d: %d bytes, over the %d an API server takes in a request: split it into documents", n, len(doc), MaxDocumentBytes)
		}
		out.document = n
		if err := d.decodeDocument(&out, doc, 0); err != nil {
			return nil, nil, fmt.Errorf("document %d: %w", n, err)
		}
	}
}

// decoded is what a stream decoded into so far; document is the position
// of the document being decoded.
type decoded struct {
	objs     []runtime.Object
	warnings []Warning
	document int
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

// decodeDocument decodes doc into out, a List's items too; depth is how
// many Lists hold doc.
func (d *Decoder) decodeDocument(out *decoded, doc []byte, depth int) error {
	doc = jsonOf(doc)
	obj, gvk, err := d.decodeObject(doc)
	if err != nil {
		return err
	}
	if list, ok := obj.(*corev1.List); ok {
		if depth == maxListDepth {
			return fmt.Errorf("a List inside %d Lists: at most %d may nest", depth, maxListDepth)
		}
		for i, item := range list.Items {
			if err := d.decodeDocument(out, bytes.TrimSpace(item.Raw), depth+1); err != nil {
				return fmt.Errorf("items[%d]: %w", i, err)
			}
		}
		return nil
	}
	if !Supported(obj) {
		return fmt.Errorf("%s is not a kind sockmesh reads", kindOf(gvk))
	}
	if d.crds == nil {
		out.objs = append(out.objs, obj)
		return nil
	}
	switch {
	case d.crds.Has(*gvk):
		if obj, err = d.admit(doc, *gvk, obj); err != nil {
			return err
		}
	case d.crds.HasGroup(gvk.Group):
		// A kind read without its CRD would go unchecked: refuse it.
		return fmt.Errorf("%s: no CRD of sockmesh's serves %s", Key(obj), gvk.GroupVersion())
	}
	if err := validateMetadata(obj); err != nil {
		return err
	}
	if err := validateCore(obj); err != nil {
		return err
	}
	out.objs = append(out.objs, obj)
	if dep, ok := d.crds.Deprecated(*gvk); ok {
		out.warnings = append(out.warnings, Warning{Document: out.document, Object: Key(obj),
			APIVersion: gvk.GroupVersion().String(), Use: dep.Use.String(), Text: dep.Warning})
	}
	return nil
}

// jsonOf is doc as JSON, converted once for the decoder and admission
// alike: YAML was converted three times, twice in the decoder (to JSON,
// then strictly, for keys given twice) and again in admit, and a 3 MB
// route took three times as long as its JSON (BenchmarkDecodeLargeRoute).
// A document that does not convert strictly is returned as it is: the
// decoder's error names what is wrong, as it did.
func jsonOf(doc []byte) []byte {
	if utilyaml.IsJSONBuffer(doc) {
		return doc
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return doc
	}
	return js
}

// decodeObject decodes doc into its typed object, normalized; a v1beta1
// ReferenceGrant is returned as v1.
func (d *Decoder) decodeObject(doc []byte) (runtime.Object, *schema.GroupVersionKind, error) {
	obj, gvk, err := d.decoder.Decode(doc, nil, nil)
	if err != nil {
		return nil, gvk, d.describe(err, gvk, doc)
	}
	obj = asV1(obj)
	normalize(obj)
	return obj, gvk, nil
}

// describe is the error for doc, which did not decode. Errors about a
// missing kind or apiVersion quote the whole document: they are replaced,
// so that a large document makes no large message.
func (d *Decoder) describe(err error, gvk *schema.GroupVersionKind, doc []byte) error {
	switch {
	case !isObject(doc):
		return errors.New("decode: not an object: a document is a mapping with apiVersion, kind and metadata")
	case runtime.IsMissingKind(err):
		return errors.New("decode: kind is missing")
	case runtime.IsMissingVersion(err):
		return errors.New("decode: apiVersion is missing")
	case runtime.IsNotRegisteredError(err):
		return d.notServed(doc, err)
	case gvk != nil && gvk.Kind != "":
		return fmt.Errorf("decode %s: %w", kindOf(gvk), err)
	}
	return fmt.Errorf("decode: %w", err)
}

// notServed is the error for doc, whose apiVersion and kind the decoder
// does not know: the versions the CRDs serve of a Gateway API kind, so
// that a manifest for an older release says what to write instead.
func (d *Decoder) notServed(doc []byte, err error) error {
	var tm metav1.TypeMeta
	if yaml.Unmarshal(doc, &tm) != nil {
		return fmt.Errorf("decode: %w", err)
	}
	gvk := tm.GroupVersionKind()
	var served []string
	if d.crds != nil {
		for _, k := range d.crds.Kinds() {
			if k.GroupKind() == gvk.GroupKind() {
				served = append(served, k.GroupVersion().String())
			}
		}
	}
	if len(served) == 0 {
		return fmt.Errorf("%s is not a kind sockmesh reads", kindOf(&gvk))
	}
	slices.Sort(served)
	return fmt.Errorf("%s: the Gateway API v1.7.0 CRDs serve %s as %s only", kindOf(&gvk), gvk.Kind, strings.Join(served, ", "))
}

// isObject reports whether doc may be an object: its top is a mapping, or
// it is no valid YAML (the decoder's error says where).
func isObject(doc []byte) bool {
	js, err := utilyaml.ToJSON(doc)
	return err != nil || bytes.HasPrefix(bytes.TrimSpace(js), []byte("{"))
}

func kindOf(gvk *schema.GroupVersionKind) string {
	if gvk == nil {
		return "object"
	}
	return fmt.Sprintf("kind %s (apiVersion %s)", gvk.Kind, gvk.GroupVersion())
}

// asV1 returns an object of an older version the CRDs serve with v1's
// schema (NewUncheckedDecoder lists them) as v1, as the API server stores
// it; other objects as they are.
func asV1(obj runtime.Object) runtime.Object {
	v1 := gwv1.GroupVersion.String()
	switch o := obj.(type) {
	case *gwv1beta1.ReferenceGrant:
		out := gwv1.ReferenceGrant(*o)
		out.APIVersion = v1
		return &out
	case *gwv1beta1.HTTPRoute:
		out := gwv1.HTTPRoute(*o)
		out.APIVersion = v1
		return &out
	case *gwv1alpha3.BackendTLSPolicy:
		out := gwv1.BackendTLSPolicy(*o)
		out.APIVersion = v1
		return &out
	}
	return obj
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
