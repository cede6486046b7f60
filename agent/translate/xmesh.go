package translate

import (
	"cmp"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
	"sigs.k8s.io/gateway-api/pkg/features"
)

// SupportedFeatures are the Gateway API features sockmesh implements end to
// end, as XMesh status reports them (sorted, as the API requires).
// ClusterTrustBundle is left out when the cluster does not serve the API
// (GEP-5075).
func SupportedFeatures(clusterTrustBundlesUnavailable bool) []gwv1.SupportedFeature {
	names := []features.FeatureName{
		features.SupportBackendTLSPolicy,
		features.SupportBackendTLSPolicySANValidation,
	}
	names = append(names, meshRouteFeatures...)
	if !clusterTrustBundlesUnavailable {
		names = append(names, features.SupportClusterTrustBundle)
	}
	out := make([]gwv1.SupportedFeature, 0, len(names))
	for _, n := range names {
		out = append(out, gwv1.SupportedFeature{Name: gwv1.FeatureName(n)})
	}
	slices.SortFunc(out, func(a, b gwv1.SupportedFeature) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// meshRouteFeatures are the GAMMA features sockmesh runs end to end, each
// proven by a test/e2e scenario with a Service parent: matching,
// precedence, producer and consumer routes, redirects, rewrites, header
// modifiers, weights, mirrors, CORS, external authorization, timeouts, retries, ReferenceGrants, and h2c
// and WebSocket backends behind a route. A feature joins this list only
// with its end-to-end test.
var meshRouteFeatures = []features.FeatureName{
	features.SupportMesh,
	features.SupportMeshClusterIPMatching,
	features.SupportMeshConsumerRoute,
	features.SupportMeshHTTPRouteRewritePath,
	features.SupportMeshHTTPRouteSchemeRedirect,
	features.SupportMeshHTTPRouteRedirectPort,
	features.SupportMeshHTTPRouteRedirectPath,
	features.SupportMeshHTTPRouteBackendRequestHeaderModification,
	features.SupportMeshHTTPRouteQueryParamMatching,
	features.SupportMeshHTTPRouteNamedRouteRule,
	features.SupportHTTPRoute,
	features.SupportHTTPRouteParentRefPort,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteBackendRequestHeaderModification,
	features.SupportHTTPRouteQueryParamMatching,
	features.SupportHTTPRouteMethodMatching,
	features.SupportHTTPRouteHostRewrite,
	features.SupportHTTPRoutePathRewrite,
	features.SupportHTTPRouteBackendURLRewrite,
	features.SupportHTTPRoutePathRedirect,
	features.SupportHTTPRoutePortRedirect,
	features.SupportHTTPRouteSchemeRedirect,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
	features.SupportHTTPRouteNamedRouteRule,
	features.SupportHTTPRouteRequestMirror,
	features.SupportHTTPRouteRequestMultipleMirrors,
	features.SupportHTTPRouteRequestPercentageMirror,
	features.SupportHTTPRouteCORS,
	featureHTTPRouteExternalAuthHTTP,
	featureHTTPRouteExternalAuthGRPC,
	featureHTTPRouteExternalAuthForwardBody,
	features.SupportHTTPRouteRequestTimeout,
	features.SupportHTTPRouteBackendTimeout,
	features.SupportHTTPRouteRetryCodes,
	features.SupportHTTPRouteRetryConnectionError,
	features.SupportHTTPRouteBackendProtocolH2C,
	features.SupportHTTPRouteBackendProtocolWebSocket,
	features.SupportReferenceGrant,
	features.SupportGRPCRoute,
	features.SupportGRPCRouteNamedRouteRule,
	features.SupportGRPCRouteRequestHeaderModifier,
}

// The ExternalAuth filter's features, named as its API text names them:
// gateway-api v1.7.0's features package has no constants for them.
const (
	featureHTTPRouteExternalAuthHTTP        features.FeatureName = "HTTPRouteExternalAuthHTTP"
	featureHTTPRouteExternalAuthGRPC        features.FeatureName = "HTTPRouteExternalAuthGRPC"
	featureHTTPRouteExternalAuthForwardBody features.FeatureName = "HTTPRouteExternalAuthForwardBody"
)

// meshes writes the status of every XMesh whose controllerName is ours.
// sockmesh takes no parameters, so a parametersRef makes the XMesh
// InvalidParameters.
func meshes(in Input) map[string]gwxv1alpha1.MeshStatus {
	out := map[string]gwxv1alpha1.MeshStatus{}
	for _, m := range sortedObjects(in.XMeshes) {
		if m.Spec.ControllerName != ControllerName {
			continue
		}
		if _, dup := out[m.Name]; dup {
			continue
		}
		c := conditionSet{generation: m.Generation, now: metav1.NewTime(in.Now)}
		if m.Spec.ParametersRef != nil {
			c.set(string(gwxv1alpha1.MeshConditionAccepted), false, string(gwxv1alpha1.MeshReasonInvalidParameters),
				"sockmesh takes no parameters; remove parametersRef")
		} else {
			c.set(string(gwxv1alpha1.MeshConditionAccepted), true, string(gwxv1alpha1.MeshReasonAccepted), "accepted by sockmesh")
		}
		out[m.Name] = gwxv1alpha1.MeshStatus{Conditions: c.conds, SupportedFeatures: SupportedFeatures(in.ClusterTrustBundlesUnavailable)}
	}
	return out
}
