package translate

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Result is Translate's output: the parts of the next Snapshot (the agent
// numbers the version when it publishes), the status to write, and the
// objects sockmesh must own in the cluster.
type Result struct {
	Frontends []snapshot.Frontend
	Backends  []snapshot.Backend
	Workloads []snapshot.Workload
	Status    Status
	// EndpointSelectorServices are the headless Services that EndpointSelector
	// XBackends need (one per XBackend, generateName, ownerReference to it),
	// sorted by namespace and XBackend. Translate finds existing ones in
	// Input.Services by the label LabelXBackend and the ownerReference: an
	// entry with Name set is that existing Service as it should be (update
	// it if it differs); one with only GenerateName is to be created. The
	// writer deletes labelled, XBackend-owned Services not listed here.
	EndpointSelectorServices []*corev1.Service
	// Unrepresented are the policy targets, route parents and XBackend
	// ancestors left without a status entry because other controllers'
	// entries fill the object's status: a policy is unimplementable there
	// (a route is served, and the Service leads to the XBackend, all the
	// same), and no condition can say so, so sockmeshctl shows these
	// instead. In policy order (older first, as translate meets them),
	// then target order; then routes, HTTPRoutes first, by
	// namespace/name, in parentRef order; then XBackends by
	// namespace/name, in ancestor order.
	Unrepresented []Unrepresented
	// ChangesAt is the earliest instant after Input.Now at which a
	// judgement Translate made by the time (a client certificate, or a CA
	// reference's certificates, not yet valid, or valid until they
	// expire) changes: the same objects translated then give another
	// Result, so the agent translates again at that instant. Zero when no
	// judgement depends on the time.
	ChangesAt time.Time
	// Failures are the objects whose translation panicked, in the order
	// Translate met them. Each is judged as an invalid object of its kind
	// is, closed for what it governs: a BackendTLSPolicy's or XBackend's
	// ports fail closed, a route or XBackendTrafficPolicy is applied
	// nowhere, and their status says Accepted=False with the internal
	// error and ResolvedRefs=Unknown (ReasonInternalError); a Service's ports that a BackendTLSPolicy governs or that
	// stand for an XBackend fail closed, its others are not captured. A
	// route is listed too when the join of the routes at a Service port it
	// attaches to panicked: that port's table answers every request with
	// an error, and the route's entries toward it say so.
	Failures []Failure
}

// Unrepresented is one target of a policy, parent of a route or ancestor
// of an XBackend, whose status had no room for it (BackendTLSPolicy: its
// ports fail closed; XBackendTrafficPolicy: the policy is not applied to
// it; HTTPRoute, GRPCRoute: the route is served there; XBackend: the
// Service leads to it all the same). Policy names the policy, route or
// XBackend.
type Unrepresented struct {
	Policy  snapshot.ObjectRef   `json:"policy"`
	Target  gwv1.ParentReference `json:"target"`
	Message string               `json:"message"`
}

// LabelXBackend marks a headless Service sockmesh generated for an
// EndpointSelector XBackend; its value is the XBackend's name, or
// "sha256-<8 hex digits>" of it when the name is too long for a label.
const LabelXBackend = "sockmesh.io/xbackend"
