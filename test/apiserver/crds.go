package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

// GatewayAPIModule is the module whose experimental CRDs an Env installs: the
// version the project's go.mod requires, read from the module cache, so the
// CRDs always match the typed clients the code is compiled against.
const GatewayAPIModule = "sigs.k8s.io/gateway-api"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// GatewayAPICRDDir returns config/crd/experimental of the gateway-api module
// the project requires, downloading the module if the cache lacks it.
func GatewayAPICRDDir(ctx context.Context) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	// `go mod download -json` prints the directory and fetches the module
	// only when it is not in the cache yet.
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", GatewayAPIModule)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w: %s", GatewayAPIModule, err, stderr.Bytes())
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("decode go mod download output: %w", err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %s", GatewayAPIModule, m.Error)
	}
	return filepath.Join(m.Dir, "config", "crd", "experimental"), nil
}

// InstallCRDs applies every CustomResourceDefinition in the YAML files of dir
// with server-side apply (client-side apply cannot: the HTTPRoute CRD
// overflows the last-applied annotation) and waits until all are
// Established. Other kinds in dir (the safe-upgrades admission policy) are
// left out: they guard upgrades of a real cluster, not a test.
func InstallCRDs(ctx context.Context, dyn dynamic.Interface, dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("list crds in %s: %w", dir, err)
	}
	var names []string
	for _, f := range files {
		objs, err := readObjects(f)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if o.GetKind() != "CustomResourceDefinition" {
				continue
			}
			_, err := dyn.Resource(crdGVR).Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "sockmesh-test", Force: true})
			if err != nil {
				return nil, fmt.Errorf("apply crd %s: %w", o.GetName(), err)
			}
			names = append(names, o.GetName())
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("install crds: none found in %s", dir)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := waitEstablished(ctx, dyn, n); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func readObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode %s: %w", path, err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		crd, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err == nil && established(crd) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for crd %s to be established: %w", name, context.Cause(ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
