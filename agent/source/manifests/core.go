package manifests

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateCore checks the fields translate reads of a core object with the
// API server's rules for them (k8s.io/kubernetes' validation, which is no
// library: the few rules are restated here, each test case asked of a
// real API server). Translate would skip such a value without a word (a
// port of 70000, an unparsable clusterIP) or take one the API server
// refuses (an IPv6 address in an IPv4 EndpointSlice); refused here, the
// file's error says which field, as kubectl apply would.
func validateCore(obj runtime.Object) error {
	var errs field.ErrorList
	switch o := obj.(type) {
	case *corev1.Service:
		errs = validateService(o)
	case *discoveryv1.EndpointSlice:
		errs = validateEndpointSlice(o)
	case *certificatesv1.ClusterTrustBundle:
		errs = validateTrustBundle(field.NewPath("spec", "trustBundle"), o.Spec.TrustBundle)
	case *corev1.Secret:
		errs = validateSecret(o)
	}
	if len(errs) > 0 {
		return invalid(obj, errs)
	}
	return nil
}

// protocols are the port protocols the API server takes; an empty one is
// defaulted to TCP before validation.
var protocols = []string{string(corev1.ProtocolSCTP), string(corev1.ProtocolTCP), string(corev1.ProtocolUDP)}

func validateProtocol(path *field.Path, p corev1.Protocol) field.ErrorList {
	switch p {
	case "", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		return nil
	}
	return field.ErrorList{field.NotSupported(path, p, protocols)}
}

func validatePort(path *field.Path, port int32) field.ErrorList {
	if msgs := validation.IsValidPortNum(int(port)); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(path, port, msgs[0])}
	}
	return nil
}

func validateService(s *corev1.Service) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		// The API server fills clusterIPs from clusterIP before it
		// validates them.
		ips = []string{s.Spec.ClusterIP}
	}
	for i, ip := range ips {
		if i == 0 && ip == corev1.ClusterIPNone {
			continue
		}
		errs = append(errs, validation.IsValidIPForLegacyField(spec.Child("clusterIPs").Index(i), ip, true, nil)...)
	}
	for i, p := range s.Spec.Ports {
		path := spec.Child("ports").Index(i)
		errs = append(errs, validatePort(path.Child("port"), p.Port)...)
		errs = append(errs, validateProtocol(path.Child("protocol"), p.Protocol)...)
		errs = append(errs, validateTargetPort(path.Child("targetPort"), p)...)
	}
	return errs
}

// validateTargetPort: a number or a port name; unset, it is defaulted to
// the port before validation.
func validateTargetPort(path *field.Path, p corev1.ServicePort) field.ErrorList {
	switch t := p.TargetPort; {
	case t.Type == intstr.String:
		if msgs := validation.IsValidPortName(t.StrVal); len(msgs) > 0 {
			return field.ErrorList{field.Invalid(path, t.StrVal, msgs[0])}
		}
		return nil
	case t.IntVal == 0:
		return validatePort(path, p.Port)
	default:
		return validatePort(path, t.IntVal)
	}
}

func validateEndpointSlice(es *discoveryv1.EndpointSlice) field.ErrorList {
	var errs field.ErrorList
	var family func(netip.Addr) bool
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		family = netip.Addr.Is4
	case discoveryv1.AddressTypeIPv6:
		family = netip.Addr.Is6
	case discoveryv1.AddressTypeFQDN:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("addressType"), es.AddressType,
			[]string{string(discoveryv1.AddressTypeFQDN), string(discoveryv1.AddressTypeIPv4), string(discoveryv1.AddressTypeIPv6)}))
	}
	for i, ep := range es.Endpoints {
		if family == nil {
			break // FQDN: translate dials none of them
		}
		path := field.NewPath("endpoints").Index(i).Child("addresses")
		for j, a := range ep.Addresses {
			if ipErrs := validation.IsValidIPForLegacyField(path.Index(j), a, true, nil); len(ipErrs) > 0 {
				errs = append(errs, ipErrs...)
			} else if addr, _ := netip.ParseAddr(a); !family(addr) {
				// The API server names the list here, not the item.
				errs = append(errs, field.Invalid(path, a, fmt.Sprintf("must be an %s address", es.AddressType)))
			}
		}
	}
	// A port number outside 1-65535 is taken (translate dials no endpoint
	// at it), as the API server takes it.
	for i, p := range es.Ports {
		if p.Protocol != nil {
			errs = append(errs, validateProtocol(field.NewPath("ports").Index(i).Child("protocol"), *p.Protocol)...)
		}
	}
	return errs
}

// validateTrustBundle is the API server's rule for a ClusterTrustBundle's
// trustBundle: PEM CERTIFICATE blocks without headers, each a CA
// certificate, at least one, none twice.
func validateTrustBundle(path *field.Path, bundle string) field.ErrorList {
	var errs field.ErrorList
	bad := func(msg string) { errs = append(errs, field.Invalid(path, "<value omitted>", msg)) }
	var anchors [][]byte
	at := map[string][]int{} // anchor → its entries
	rest := []byte(bundle)
	for i := 0; ; i++ {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		switch cert, err := x509.ParseCertificate(b.Bytes); {
		case b.Type != "CERTIFICATE":
			bad(fmt.Sprintf("entry %d has bad block type: %v", i, b.Type))
		case len(b.Headers) != 0:
			bad(fmt.Sprintf("entry %d has PEM block headers: %v", i, b.Headers))
		case err != nil:
			bad(fmt.Sprintf("entry %d does not parse as X.509", i))
		case !cert.IsCA:
			bad(fmt.Sprintf("entry %d does not have the CA bit set", i))
		default:
			if at[string(b.Bytes)] == nil {
				anchors = append(anchors, b.Bytes)
			}
			at[string(b.Bytes)] = append(at[string(b.Bytes)], i)
		}
	}
	if len(errs) == 0 && len(anchors) == 0 {
		bad("at least one trust anchor must be provided")
	}
	for _, a := range anchors {
		if entries := at[string(a)]; len(entries) > 1 {
			bad(fmt.Sprintf("duplicate trust anchor (indices %v)", entries))
		}
	}
	return errs
}

// validateSecret: a kubernetes.io/tls Secret has a certificate and a key.
func validateSecret(s *corev1.Secret) field.ErrorList {
	var errs field.ErrorList
	if s.Type != corev1.SecretTypeTLS {
		return nil
	}
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
		if _, ok := s.Data[k]; !ok {
			errs = append(errs, field.Required(field.NewPath("data").Key(k), ""))
		}
	}
	return errs
}
