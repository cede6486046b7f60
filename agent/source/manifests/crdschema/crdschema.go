package crdschema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"sync"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

//go:embed crds/*.yaml
var crdFiles embed.FS

// Set holds the CRDs of crds/, each served version compiled on first use.
// It is safe for concurrent use.
type Set struct {
	versions map[schema.GroupVersionKind]func() (*version, error)
	// status holds the served versions with the status subresource.
	status map[schema.GroupVersionKind]bool
	// deprecated holds the served versions the CRDs deprecate.
	deprecated map[schema.GroupVersionKind]Deprecation
}

// Deprecation is what an API server says of an object of a version its
// CRD deprecates, on every request: kubectl prints it as a warning.
type Deprecation struct {
	// Warning is the CRD's deprecationWarning, or the API server's own
	// "group/version Kind is deprecated; use group/storage Kind".
	Warning string
	// Use is the version to write instead: the CRD's storage version, as
	// which the API server stores the object.
	Use schema.GroupVersion
}

// version is one served version of a CRD, compiled as the API server
// compiles it when the CRD is established.
type version struct {
	structural *structuralschema.Structural
	schema     validation.SchemaValidator
	cel        *cel.Validator
}

// Embedded returns the Set of the embedded CRDs. They are parsed once per
// process (about 0.1 s) into a Set that never changes after; each version's
// CEL rules are compiled when the first object of that version is admitted
// (HTTPRoute v1's take about 0.2 s).
func Embedded() (*Set, error) { return embedded() }

var embedded = sync.OnceValues(func() (*Set, error) { return load(crdFiles) })

// load parses every CRD file of fsys's crds/.
func load(fsys fs.FS) (*Set, error) {
	files, err := fs.Glob(fsys, "crds/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list embedded crds: %w", err)
	}
	s := &Set{versions: map[schema.GroupVersionKind]func() (*version, error){}, status: map[schema.GroupVersionKind]bool{},
		deprecated: map[schema.GroupVersionKind]Deprecation{}}
	for _, name := range files {
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(data, &crd); err != nil {
			return nil, fmt.Errorf("decode %s: %w", name, err)
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}
			props := v.Schema.OpenAPIV3Schema
			s.versions[gvk] = sync.OnceValues(func() (*version, error) {
				c, err := compile(props)
				if err != nil {
					return nil, fmt.Errorf("compile crd %s, version %s: %w", crd.Name, gvk.Version, err)
				}
				return c, nil
			})
			s.status[gvk] = v.Subresources != nil && v.Subresources.Status != nil
			if v.Deprecated {
				s.deprecated[gvk] = deprecation(&crd, v)
			}
		}
	}
	return s, nil
}

// deprecation is what the API server warns of for objects of v, a
// deprecated version of crd (apiextensions-apiserver's
// defaultDeprecationWarning when the CRD has no text, naming the storage
// version rather than the newest one served).
func deprecation(crd *apiextensionsv1.CustomResourceDefinition, v apiextensionsv1.CustomResourceDefinitionVersion) Deprecation {
	use := schema.GroupVersion{Group: crd.Spec.Group}
	for _, sv := range crd.Spec.Versions {
		if sv.Storage {
			use.Version = sv.Name
		}
	}
	if v.DeprecationWarning != nil && *v.DeprecationWarning != "" {
		return Deprecation{Warning: *v.DeprecationWarning, Use: use}
	}
	kind := crd.Spec.Names.Kind
	return Deprecation{Warning: fmt.Sprintf("%s/%s %s is deprecated; use %s %s", crd.Spec.Group, v.Name, kind, use, kind), Use: use}
}

func compile(props *apiextensionsv1.JSONSchemaProps) (*version, error) {
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(props, &internal, nil); err != nil {
		return nil, fmt.Errorf("convert schema: %w", err)
	}
	structural, err := structuralschema.NewStructural(&internal)
	if err != nil {
		return nil, fmt.Errorf("structural schema: %w", err)
	}
	validator, _, err := validation.NewSchemaValidator(&internal)
	if err != nil {
		return nil, fmt.Errorf("schema validator: %w", err)
	}
	return &version{
		structural: structural,
		schema:     validator,
		cel:        cel.NewValidator(structural, true, celconfig.PerCallLimit),
	}, nil
}

// Has reports whether s holds a served version gvk.
func (s *Set) Has(gvk schema.GroupVersionKind) bool {
	_, ok := s.versions[gvk]
	return ok
}

// HasGroup reports whether s holds a CRD of group.
func (s *Set) HasGroup(group string) bool {
	for gvk := range s.versions {
		if gvk.Group == group {
			return true
		}
	}
	return false
}

// Kinds returns every served version s holds, in no order.
func (s *Set) Kinds() []schema.GroupVersionKind {
	return slices.Collect(maps.Keys(s.versions))
}

// Deprecated reports whether gvk is a version its CRD deprecates, and
// what the API server says of it.
func (s *Set) Deprecated(gvk schema.GroupVersionKind) (Deprecation, bool) {
	d, ok := s.deprecated[gvk]
	return d, ok
}

// HasStatusSubresource reports whether gvk's CRD serves status as a
// subresource: the API server then drops an object's status on create
// (customResourceStrategy.PrepareForCreate), before validating it.
func (s *Set) HasStatusSubresource(gvk schema.GroupVersionKind) bool { return s.status[gvk] }

// Admit applies the defaults of gvk's CRD to obj, an object's JSON content
// as unstructured decoding makes it (integers as int64), and returns what
// the CRD refuses in it, its status too, as field errors with the API
// server's paths and messages. An error means gvk is not in s or its CRD
// does not compile.
func (s *Set) Admit(gvk schema.GroupVersionKind, obj map[string]any) (field.ErrorList, error) {
	compiled, ok := s.versions[gvk]
	if !ok {
		return nil, fmt.Errorf("no crd serves %s", gvk)
	}
	v, err := compiled()
	if err != nil {
		return nil, err
	}
	// The API server's order: defaults are applied when the request is
	// decoded, before validation.
	defaulting.Default(obj, v.structural)
	errs := validation.ValidateCustomResource(nil, obj, v.schema)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, v.structural, obj)...)
	if blocking(errs) {
		// As the API server does: CEL rules assume the schema holds.
		return append(errs, field.Invalid(nil, nil, "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation")), nil
	}
	// The budget bounds the rules' cost; nothing here waits on I/O.
	celErrs, _ := v.cel.Validate(context.Background(), nil, v.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...), nil
}

// blocking reports whether errs has an error after which the API server
// does not evaluate CEL rules: a wrong type, a missing required field, a
// value outside an enum or over a length, item or property limit.
func blocking(errs field.ErrorList) bool {
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return true
		}
	}
	return false
}
