package translate

import (
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"
)

// Status is what Translate says about each object it looked at. Every entry
// carries only sockmesh's own ancestors/parents (ControllerName); the status
// writer merges them with other controllers' entries, which it never touches.
// An object that Translate examined but no longer relates to any ancestor
// has an entry with an empty slice, so the writer removes stale entries.
type Status struct {
	BackendTLSPolicies map[types.NamespacedName][]gwv1.PolicyAncestorStatus
	// XBackendTrafficPolicies: one ancestor per targeted Service or
	// XBackend.
	XBackendTrafficPolicies map[types.NamespacedName][]gwv1.PolicyAncestorStatus
	XBackends               map[types.NamespacedName][]gwxv1alpha1.BackendAncestorStatus
	// HTTPRoutes and GRPCRoutes hold every route Translate examined, with
	// its Service parents (an empty slice for a route with none). A nil map
	// means routes were not examined, so the writer must leave their
	// status alone.
	HTTPRoutes map[types.NamespacedName][]gwv1.RouteParentStatus
	GRPCRoutes map[types.NamespacedName][]gwv1.RouteParentStatus
	// XMeshes holds the conditions and supported features of each XMesh
	// whose controllerName is ours, keyed by name (cluster-scoped).
	XMeshes map[string]gwxv1alpha1.MeshStatus
}
