package translate_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
)

var update = flag.Bool("update", false, "rewrite golden files (testdata/**/*.out.yaml, testdata/certs)")

// Fixtures: testdata/<feature>/<case>.in.yaml holds manifests, optionally
// led by a header document of kind TranslateInput (no apiVersion) giving
// what sources do not: now, node, resolved, clusterTrustBundlesUnavailable.
// Before decoding, the file is a text/template in which {{pem "ca.pem"}}
// is a YAML double-quoted string holding testdata/certs/ca.pem (given more
// files, their bundle), and
// {{file "dir/x.yaml"}} inserts testdata/dir/x.yaml as it is. The
// expected Result is <case>.out.yaml; -update rewrites it.

// header is the TranslateInput fixture document.
type header struct {
	Kind                           string                  `json:"kind"`
	Now                            time.Time               `json:"now"`
	Node                           translate.Node          `json:"node"`
	Resolved                       map[string][]netip.Addr `json:"resolved"`
	ClusterTrustBundlesUnavailable bool                    `json:"clusterTrustBundlesUnavailable"`
}

// defaultNow is Input.Now when a fixture does not set it.
var defaultNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// golden is what an .out.yaml holds: the Result, status maps keyed by
// "namespace/name" so they marshal.
type golden struct {
	Frontends                []snapshot.Frontend       `json:"frontends"`
	Backends                 []snapshot.Backend        `json:"backends"`
	Workloads                []snapshot.Workload       `json:"workloads"`
	EndpointSelectorServices []*corev1.Service         `json:"endpointSelectorServices,omitempty"`
	Status                   goldenStatus              `json:"status"`
	Unrepresented            []translate.Unrepresented `json:"unrepresented,omitempty"`
	ChangesAt                time.Time                 `json:"changesAt,omitzero"`
}

type goldenStatus struct {
	BackendTLSPolicies      map[string][]gwv1.PolicyAncestorStatus         `json:"backendTLSPolicies,omitempty"`
	XBackendTrafficPolicies map[string][]gwv1.PolicyAncestorStatus         `json:"xBackendTrafficPolicies,omitempty"`
	XBackends               map[string][]gwxv1alpha1.BackendAncestorStatus `json:"xBackends,omitempty"`
	HTTPRoutes              map[string][]gwv1.RouteParentStatus            `json:"httpRoutes,omitempty"`
	GRPCRoutes              map[string][]gwv1.RouteParentStatus            `json:"grpcRoutes,omitempty"`
	XMeshes                 map[string]gwxv1alpha1.MeshStatus              `json:"xMeshes,omitempty"`
}

func toGolden(r translate.Result) golden {
	return golden{
		Frontends:                r.Frontends,
		Backends:                 r.Backends,
		Workloads:                r.Workloads,
		EndpointSelectorServices: r.EndpointSelectorServices,
		Status: goldenStatus{
			BackendTLSPolicies:      byName(r.Status.BackendTLSPolicies),
			XBackendTrafficPolicies: byName(r.Status.XBackendTrafficPolicies),
			XBackends:               byName(r.Status.XBackends),
			HTTPRoutes:              byName(r.Status.HTTPRoutes),
			GRPCRoutes:              byName(r.Status.GRPCRoutes),
			XMeshes:                 r.Status.XMeshes,
		},
		Unrepresented: r.Unrepresented,
		ChangesAt:     r.ChangesAt,
	}
}

func byName[V any](m map[types.NamespacedName]V) map[string]V {
	if m == nil {
		return nil
	}
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k.String()] = v
	}
	return out
}

func TestTranslate(t *testing.T) {
	cases, err := filepath.Glob(filepath.Join("testdata", "*", "*.in.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no fixtures under testdata/*/")
	}
	for _, in := range cases {
		name := strings.TrimSuffix(strings.TrimPrefix(in, "testdata"+string(filepath.Separator)), ".in.yaml")
		t.Run(name, func(t *testing.T) {
			input := loadInput(t, in)
			res, err := translate.Translate(input)
			if err != nil {
				t.Fatalf("Translate(%s) error: %v", in, err)
			}
			checkDeterministic(t, input, res)
			checkChangesAt(t, input, res)
			checkResult(t, res)
			checkStatusWithoutDNS(t, input, res)
			got := toGolden(res)
			out := strings.TrimSuffix(in, ".in.yaml") + ".out.yaml"
			if *update {
				b, err := yaml.Marshal(got)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(out, b, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			raw, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("read golden: %v (run go test ./agent/translate -update)", err)
			}
			var want golden
			if err := yaml.UnmarshalStrict(raw, &want); err != nil {
				t.Fatalf("parse %s: %v", out, err)
			}
			if diff := cmp.Diff(want, got, cmpOpts...); diff != "" {
				t.Errorf("Translate(%s) mismatch (-%s +got); run with -update and review the diff:\n%s", in, out, diff)
			}
		})
	}
}

// cmpOpts compare Results: netip values by ==, nil and empty alike, and
// lastTransitionTime ignored (the status writer keeps old timestamps).
var cmpOpts = []cmp.Option{
	cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{}, netip.Prefix{}),
	cmpopts.EquateEmpty(),
	cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime"),
}

// checkDeterministic translates again with every input list reversed and
// requires the same bytes: the Result must not depend on input order.
func checkDeterministic(t *testing.T, in translate.Input, first translate.Result) {
	t.Helper()
	rev := in
	rev.Services = reversed(in.Services)
	rev.EndpointSlices = reversed(in.EndpointSlices)
	rev.Namespaces = reversed(in.Namespaces)
	rev.Pods = reversed(in.Pods)
	rev.ConfigMaps = reversed(in.ConfigMaps)
	rev.Secrets = reversed(in.Secrets)
	rev.ClusterTrustBundles = reversed(in.ClusterTrustBundles)
	rev.BackendTLSPolicies = reversed(in.BackendTLSPolicies)
	rev.HTTPRoutes = reversed(in.HTTPRoutes)
	rev.GRPCRoutes = reversed(in.GRPCRoutes)
	rev.XBackends = reversed(in.XBackends)
	rev.XBackendTrafficPolicies = reversed(in.XBackendTrafficPolicies)
	rev.XMeshes = reversed(in.XMeshes)
	rev.ReferenceGrants = reversed(in.ReferenceGrants)
	second, err := translate.Translate(rev)
	if err != nil {
		t.Fatalf("Translate(reversed input) error: %v", err)
	}
	a, _ := json.Marshal(toGolden(first))
	b, _ := json.Marshal(toGolden(second))
	if !bytes.Equal(a, b) {
		t.Errorf("Translate depends on input order:\n%s", cmp.Diff(string(a), string(b)))
	}
}

// checkChangesAt translates again just before Result.ChangesAt, requiring
// the same Result, and at it, requiring another: ChangesAt is exactly when
// a judgement made by the time flips, so the agent's re-translation then
// is neither early nor late.
func checkChangesAt(t *testing.T, in translate.Input, first translate.Result) {
	t.Helper()
	if first.ChangesAt.IsZero() {
		return
	}
	if !first.ChangesAt.After(in.Now) {
		t.Fatalf("ChangesAt %s is not after Now %s", first.ChangesAt, in.Now)
	}
	at := func(now time.Time) golden {
		again := in
		again.Now = now
		res, err := translate.Translate(again)
		if err != nil {
			t.Fatalf("Translate at %s error: %v", now, err)
		}
		return toGolden(res)
	}
	want := toGolden(first)
	if diff := cmp.Diff(want, at(first.ChangesAt.Add(-time.Nanosecond)), cmpOpts...); diff != "" {
		t.Errorf("Translate just before ChangesAt %s differs (-at Now +just before):\n%s", first.ChangesAt, diff)
	}
	after := at(first.ChangesAt)
	after.ChangesAt = want.ChangesAt // the rest must differ
	if cmp.Equal(want, after, cmpOpts...) {
		t.Errorf("Translate at ChangesAt %s gives the Result of Now %s", first.ChangesAt, in.Now)
	}
}

func reversed[T any](s []T) []T {
	out := make([]T, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

// loadInput reads a fixture into an Input.
func loadInput(t *testing.T, path string) translate.Input {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := template.New(filepath.Base(path)).Funcs(template.FuncMap{"pem": pemString(t), "file": testdataFile}).Parse(string(raw))
	if err != nil {
		t.Fatalf("parse template %s: %v", path, err)
	}
	var text bytes.Buffer
	if err := tmpl.Execute(&text, nil); err != nil {
		t.Fatalf("expand %s: %v", path, err)
	}
	docs := splitDocuments(t, text.Bytes())
	in := translate.Input{Now: defaultNow}
	if len(docs) > 0 {
		var h header
		if err := yaml.Unmarshal(docs[0], &h); err == nil && h.Kind == "TranslateInput" {
			if err := yaml.UnmarshalStrict(docs[0], &h); err != nil {
				t.Fatalf("%s header: %v", path, err)
			}
			docs = docs[1:]
			if !h.Now.IsZero() {
				in.Now = h.Now
			}
			in.Node, in.Resolved, in.ClusterTrustBundlesUnavailable = h.Node, h.Resolved, h.ClusterTrustBundlesUnavailable
		}
	}
	docs, in.ReferenceGrants = referenceGrants(t, docs)
	// Unchecked: fixtures hold what translate must cope with from any
	// cluster, including objects the v1.7 CRDs refuse and no CRD defaults.
	dec, err := manifests.NewUncheckedDecoder()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := dec.Decode(bytes.NewReader(bytes.Join(docs, []byte("\n---\n"))))
	if err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	for _, o := range objs {
		if err := manifests.Add(&in, o); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

// referenceGrants takes the ReferenceGrant documents out of docs: the
// shared manifests decoder (agent/source/manifests) does not read that kind
// yet, so fixtures decode it here, strictly, v1 or v1beta1 (one schema).
func referenceGrants(t *testing.T, docs [][]byte) (rest [][]byte, grants []*gwv1.ReferenceGrant) {
	t.Helper()
	for _, doc := range docs {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind != "ReferenceGrant" {
			rest = append(rest, doc)
			continue
		}
		if meta.APIVersion != gwv1.GroupVersion.String() && meta.APIVersion != gwv1.GroupName+"/v1beta1" {
			t.Fatalf("ReferenceGrant with apiVersion %q", meta.APIVersion)
		}
		g := &gwv1.ReferenceGrant{}
		if err := yaml.UnmarshalStrict(doc, g); err != nil {
			t.Fatalf("decode ReferenceGrant: %v", err)
		}
		if g.Namespace == "" {
			g.Namespace = metav1.NamespaceDefault
		}
		grants = append(grants, g)
	}
	return rest, grants
}

func splitDocuments(t *testing.T, b []byte) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			docs = append(docs, doc)
		}
	}
}

func testdataFile(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	return string(b), err
}

// pemString returns the template function that quotes testdata/certs
// files, one after the other (a bundle), as a YAML (JSON) string.
func pemString(t *testing.T) func(...string) (string, error) {
	return func(names ...string) (string, error) {
		var bundle []byte
		for _, name := range names {
			b, err := os.ReadFile(filepath.Join("testdata", "certs", name))
			if err != nil {
				return "", err
			}
			bundle = append(bundle, b...)
		}
		q, err := json.Marshal(string(bundle))
		return string(q), err
	}
}
