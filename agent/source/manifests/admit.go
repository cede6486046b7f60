package manifests

import (
	"encoding/json"
	"fmt"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// admit has the CRD of gvk admit js, a document as JSON (jsonOf) which
// decoded into obj: it returns the object with the CRD's defaults, or
// what the CRD refuses, each field named as kubectl apply would name it.
func (d *Decoder) admit(js []byte, gvk schema.GroupVersionKind, obj runtime.Object) (runtime.Object, error) {
	// utiljson makes integers int64, as the API server's decoding does:
	// the CRDs' CEL rules compare them as integers.
	var content map[string]any
	if err := utiljson.Unmarshal(js, &content); err != nil {
		return nil, fmt.Errorf("%s: %w", Key(obj), err)
	}
	if !d.keepStatus && d.crds.HasStatusSubresource(gvk) {
		// Status is written through its subresource only: create drops
		// it, so that a file's status, nobody's, holds no room in it.
		delete(content, "status")
	}
	errs, err := d.crds.Admit(gvk, content)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Key(obj), err)
	}
	if len(errs) > 0 {
		return nil, invalid(obj, errs)
	}
	js, err = json.Marshal(content)
	if err != nil {
		return nil, fmt.Errorf("%s with its crd's defaults: %w", Key(obj), err)
	}
	defaulted, _, err := d.decodeObject(js)
	if err != nil {
		return nil, fmt.Errorf("%s with its crd's defaults: %w", Key(obj), err)
	}
	return defaulted, nil
}

// validateMetadata checks obj's metadata as the API server does for every
// object on create (name, namespace, labels, annotations, owner
// references), with the name rule of obj's kind.
func validateMetadata(obj runtime.Object) error {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil
	}
	if m.GetName() == "" && m.GetGenerateName() != "" {
		// The API server would make a name; kubectl apply refuses, and a
		// file read again would make another object each time.
		return fmt.Errorf("%s: metadata.name: Required value: generateName %q makes a new name at each create; kubectl apply refuses it too", Key(obj), m.GetGenerateName())
	}
	if errs := apimachineryvalidation.ValidateObjectMetaAccessor(m, namespaced(obj), nameRule(obj), field.NewPath("metadata")); len(errs) > 0 {
		return invalid(obj, errs)
	}
	return nil
}

// nameRule is the rule the API server applies to names of obj's kind.
func nameRule(obj runtime.Object) apimachineryvalidation.ValidateNameFunc {
	switch o := obj.(type) {
	case *corev1.Service, *corev1.Namespace:
		// Service names are DNS-1123 labels with RelaxedServiceNameValidation
		// (on by default since Kubernetes 1.36, GA in 1.37); older API
		// servers want DNS-1035 labels, which are DNS-1123 labels too.
		return apimachineryvalidation.NameIsDNSLabel
	case *certificatesv1.ClusterTrustBundle:
		return trustBundleNameRule(o.Spec.SignerName)
	}
	return apimachineryvalidation.NameIsDNSSubdomain
}

// trustBundleNameRule is the API server's rule for the names of
// ClusterTrustBundles of signer (k8s.io/kubernetes' core validation, which
// is no library): a bundle of a signer is named after it, "/" written ":",
// then ":" and a DNS subdomain; one without a signer has a DNS subdomain
// name without ":".
func trustBundleNameRule(signer string) apimachineryvalidation.ValidateNameFunc {
	return func(name string, prefix bool) []string {
		if signer == "" {
			if strings.Contains(name, ":") {
				return []string{`ClusterTrustBundle without signer name must not have ":" in its name`}
			}
			return apimachineryvalidation.NameIsDNSSubdomain(name, prefix)
		}
		want := strings.ReplaceAll(signer, "/", ":") + ":"
		rest, ok := strings.CutPrefix(name, want)
		if !ok {
			return []string{fmt.Sprintf("ClusterTrustBundle for signerName %s must be named with prefix %s", signer, want)}
		}
		return apimachineryvalidation.NameIsDNSSubdomain(rest, prefix)
	}
}

// invalid is the error for what the API server would refuse in obj:
// "Kind namespace/name: field: reason; field: reason".
func invalid(obj runtime.Object, errs field.ErrorList) error {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
		if e.Field == "" || e.Field == "<nil>" {
			msgs[i] = e.Detail // about the object, not a field
		}
	}
	return fmt.Errorf("%s: %s", Key(obj), strings.Join(msgs, "; "))
}
