package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// manifests are the example's objects, read as written (comments aside).
type manifests struct {
	files map[string][]*unstructured.Unstructured // by file name
	order []string
}

// readManifests reads every *.yaml file of dir.
func readManifests(dir string) (*manifests, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		return nil, fmt.Errorf("read example manifests: no *.yaml in %s (run from the repository root, or pass -manifests)", dir)
	}
	m := &manifests{files: map[string][]*unstructured.Unstructured{}}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read example manifests: %w", err)
		}
		objs, err := decodeAll(data)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		name := filepath.Base(p)
		m.files[name] = objs
		m.order = append(m.order, name)
	}
	return m, nil
}

func decodeAll(data []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		js, err := utilyaml.ToJSON(doc)
		if err != nil {
			return nil, err
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
			continue // only comments
		}
		// Unstructured's decoder keeps integers as int64, which the
		// unstructured.Nested* helpers expect.
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return nil, err
		}
		out = append(out, obj)
	}
}

// get returns the object of that kind, namespace and name.
func (m *manifests) get(kind, namespace, name string) (*unstructured.Unstructured, error) {
	for _, f := range m.order {
		for _, o := range m.files[f] {
			if o.GetKind() == kind && o.GetNamespace() == namespace && o.GetName() == name {
				return o, nil
			}
		}
	}
	return nil, fmt.Errorf("the example manifests have no %s %s/%s", kind, namespace, name)
}

// str reads a string field of an object.
func (m *manifests) str(kind, namespace, name string, field ...string) (string, error) {
	o, err := m.get(kind, namespace, name)
	if err != nil {
		return "", err
	}
	v, ok, err := unstructured.NestedString(o.Object, field...)
	if err != nil || !ok || v == "" {
		return "", fmt.Errorf("%s %s/%s has no %s", kind, namespace, name, strings.Join(field, "."))
	}
	return v, nil
}

// port reads a port number field of an object.
func (m *manifests) port(kind, namespace, name string, field ...string) (uint16, error) {
	o, err := m.get(kind, namespace, name)
	if err != nil {
		return 0, err
	}
	v, ok, err := unstructured.NestedInt64(o.Object, field...)
	if err != nil || !ok || v <= 0 || v > 65535 {
		return 0, fmt.Errorf("%s %s/%s has no port %s", kind, namespace, name, strings.Join(field, "."))
	}
	return uint16(v), nil
}

// set sets a field of an object.
func (m *manifests) set(kind, namespace, name string, value any, field ...string) error {
	o, err := m.get(kind, namespace, name)
	if err != nil {
		return err
	}
	if err := unstructured.SetNestedField(o.Object, value, field...); err != nil {
		return fmt.Errorf("set %s of %s %s/%s: %w", strings.Join(field, "."), kind, namespace, name, err)
	}
	return nil
}

// servicePort returns a Service's ClusterIP and first port and, when slice
// is not empty, the first port of that EndpointSlice (where the backend
// listens).
func (m *manifests) servicePort(namespace, name, slice string) (vip netip.AddrPort, target uint16, err error) {
	svc, err := m.get("Service", namespace, name)
	if err != nil {
		return vip, 0, err
	}
	ip, _, _ := unstructured.NestedString(svc.Object, "spec", "clusterIP")
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return vip, 0, fmt.Errorf("clusterIP %q of Service %s/%s: %w", ip, namespace, name, err)
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(ports) == 0 {
		return vip, 0, fmt.Errorf("no ports in Service %s/%s", namespace, name)
	}
	port, _, _ := unstructured.NestedInt64(ports[0].(map[string]any), "port")
	vip = netip.AddrPortFrom(addr, uint16(port))
	if slice == "" {
		return vip, 0, nil
	}
	es, err := m.get("EndpointSlice", namespace, slice)
	if err != nil {
		return vip, 0, err
	}
	eps, _, _ := unstructured.NestedSlice(es.Object, "ports")
	if len(eps) == 0 {
		return vip, 0, fmt.Errorf("EndpointSlice %s/%s has no ports", namespace, slice)
	}
	tp, _, _ := unstructured.NestedInt64(eps[0].(map[string]any), "port")
	return vip, uint16(tp), nil
}

// setEndpoints makes every endpoint of an EndpointSlice the address ip.
func (m *manifests) setEndpoints(namespace, name string, ip netip.Addr) error {
	es, err := m.get("EndpointSlice", namespace, name)
	if err != nil {
		return err
	}
	eps, _, _ := unstructured.NestedSlice(es.Object, "endpoints")
	if len(eps) == 0 {
		return fmt.Errorf("EndpointSlice %s/%s has no endpoints", namespace, name)
	}
	for _, ep := range eps {
		ep.(map[string]any)["addresses"] = []any{ip.String()}
	}
	return unstructured.SetNestedSlice(es.Object, eps, "endpoints")
}

// write writes every file, objects separated by "---", into dir.
func (m *manifests) write(dir string) error {
	for _, name := range m.order {
		var b bytes.Buffer
		fmt.Fprintf(&b, "# Written by the sockmesh demo from examples/demo/%s with this run's addresses and certificates.\n", name)
		for _, o := range m.files[name] {
			out, err := yaml.Marshal(o.Object)
			if err != nil {
				return fmt.Errorf("encode %s: %w", name, err)
			}
			b.WriteString("---\n")
			b.Write(out)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o600); err != nil {
			return fmt.Errorf("write manifests: %w", err)
		}
	}
	return nil
}
