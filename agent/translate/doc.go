// Package translate turns Kubernetes and Gateway API objects into a Snapshot
// and the status conditions those objects deserve.
//
// Translate is a pure function: objects in, Snapshot parts and status out. It
// must not use a client, read the clock (Input.Now is given), resolve names or
// touch the filesystem; everything it needs arrives in Input. Almost all policy
// logic lives here and is tested from YAML fixtures in testdata/ (see
// translate_test.go for the fixture format; go test ./agent/translate -update
// rewrites the goldens). It never panics on malformed objects, and its Result
// is sorted, so equal inputs marshal to equal bytes.
//
// # What is captured
//
// A Service port (TCP, with a ClusterIP) becomes a Frontend, over all its
// ClusterIPs (both families), when it has backend properties:
//   - a BackendTLSPolicy governs it (below);
//   - appProtocol kubernetes.io/h2c or kubernetes.io/ws (Protocol H2C, WS);
//     with a BackendTLSPolicy the cleartext variants become their TLS twins
//     (h2c → HTTP2, ws → WSS);
//   - appProtocol kubernetes.io/wss together with a BackendTLSPolicy (WSS).
//     Without one, wss is not captured: GEP-1911 lets wss be originated only
//     with a BackendTLSPolicy, and capturing it anyway would either break
//     apps that speak TLS themselves or leak plaintext;
//   - an HTTPRoute or GRPCRoute names the Service (group "", kind Service) in
//     parentRefs: the parentRef's port (or sectionName, the port's name), or
//     every port. Routing itself comes with GAMMA; route status is not
//     written here yet;
//   - the Service stands for an XBackend (below).
//
// The Frontend's Backend is the Service port itself (kind Service) with
// endpoints from the EndpointSlices labelled kubernetes.io/service-name: the
// slice port with the Service port's name (its number is the resolved
// targetPort), IPv4 and IPv6 slices (FQDN slices are skipped), conditions as
// the EndpointSlice API defines their nil values, zone, nodeName and Pod
// targetRef.
//
// Headless (clusterIP None) and ExternalName Services are never captured:
// sockmesh redirects connections by their destination, a ClusterIP, and
// clients of a headless Service dial pod IPs directly. A BackendTLSPolicy
// targeting one is Accepted=False/Invalid with that explanation, so the
// status never claims TLS that is not applied. When two malformed Services
// claim the same ClusterIP and port, the older Service keeps it.
//
// # Failure policy
//
// A Frontend whose Backend has TLS or is Invalid is FailClosed: were the
// datapath to let connections bypass a dead proxy, they would reach the
// backend in plaintext. Elsewhere (h2c, ws, route parents, plaintext
// XBackends) either is safe, and the Service annotation
// sockmesh.io/failure-policy (FailOpen or FailClosed) chooses; the default
// is FailOpen, because the app then still reaches its Service, only
// without the proxy's help. Other values leave the default.
//
// # BackendTLSPolicy (gateway.networking.k8s.io/v1)
//
// Targets are core Services in the policy's namespace, with sectionName (the
// port's name) or without (every TCP port; UDP and SCTP ports are left alone
// and the Accepted message says so). Trust comes from caCertificateRefs —
// ConfigMap ca.crt (Core), Secret ca.crt, certificates.k8s.io
// ClusterTrustBundle (GEP-5075, cluster-scoped) — or wellKnownCACertificates
// System; hostname is the SNI, and subjectAltNames (Hostname, URI) replace it
// for verification. Every PEM block must be a certificate that parses; the
// valid references form one bundle, so a bad reference beside good ones sets
// ResolvedRefs=False but keeps Accepted=True (trusting fewer anchors never
// weakens verification). Options under sockmesh.io/ are listed in package
// tlsvalidation; an unknown sockmesh.io/ key or a bad value is Invalid.
//
// Precedence follows the API: among policies naming the same Service and
// sectionName, the older creationTimestamp wins, then namespace/name; the
// others are Accepted=False/Conflicted. A policy naming a port governs that
// port over one naming the whole Service, and neither conflicts with the
// other (conformance test BackendTLSPolicyConflictResolution), unless the
// whole-Service policy is left governing no port, which is then Conflicted.
// An invalid policy still takes precedence, and its ports fail closed.
//
// Status: one PolicyAncestorStatus per distinct targetRef (ancestorRef group
// "", kind Service, the policy's namespace, sectionName when the targetRef
// has one), controllerName ControllerName, observedGeneration, and
// lastTransitionTime Input.Now (the status writer keeps older timestamps for
// unchanged conditions). Accepted: Accepted, Conflicted, NoValidCACertificate,
// Invalid or TargetNotFound; ResolvedRefs: ResolvedRefs,
// InvalidCACertificateRef or InvalidKind. A PolicyStatus holds 16 ancestors;
// past that the API calls the policy unimplementable, so further targets get
// no entry and their ports fail closed. Every case in which a policy cannot
// be honoured for a port it governs gives that port a Backend.Invalid entry:
// the proxy answers 5xx or resets, never plaintext.
//
// # XBackend (gateway.networking.x-k8s.io/v1alpha1)
//
// How an app reaches an XBackend: a Service in the XBackend's namespace
// annotated sockmesh.io/xbackend: <name> stands for it. Connections to the
// Service's ClusterIPs, on any of its TCP ports, go to the XBackend (port
// port.number). Such a Service is best selector-less: the app dials a
// normal Service name, and without sockmesh it would lead nowhere rather
// than somewhere else. A name that matches no XBackend fails closed
// (XBackendNotFound). With GAMMA, an XBackend will also be reachable as a
// backendRef (group gateway.networking.x-k8s.io, kind XBackend) of a route
// whose parent is a Service; the Backend entry is the same, keyed by
// {XBackend, namespace, name, port.number}.
//
// Ancestors (XBackend status): the Services that stand for the XBackend
// (with GAMMA, also the parent Services of routes naming it), group "", kind
// Service. An XBackend nothing reaches has no ancestors. Accepted=False
// reasons: Invalid (what the CRD's rules would have refused), NoValidCACertificate,
// EgressNotAllowed (not on Node.EgressAllow); ResolvedRefs=False:
// InvalidCACertificateRef, InvalidKind, InvalidCertificateRef or
// RefNotPermitted (clientCertificateRef). DNS answers are node-local and
// stay out of status: an unresolved name, or one whose every answer is
// refused, fails closed in this node's Snapshot only (reasons Unresolved,
// AddressesRefused).
//
// ExternalHostname: endpoints are Input.Resolved's answers on port.number,
// without loopback, link-local, unspecified, multicast and broadcast
// addresses, the node's own, and the pod and service ranges (the API's
// confused-deputy warning); names that are IP addresses or inside
// cluster.local (or Node.ClusterDomain) are Invalid. EndpointSelector: see
// xbackend_selector.go for the generated headless Service and
// Result.EndpointSelectorServices. TLS None, ServerOnly or ClientAndServer
// uses the same validation code as BackendTLSPolicy, plus the client key
// pair from a Secret's tls.crt and tls.key. sessionPersistence maps to the
// Snapshot's (a cookie without a name gets a stable generated one).
//
// XBackendTrafficPolicy is read but not applied yet: its retry budget needs
// GAMMA retries, and its sessionPersistence is deprecated in favour of
// XBackend's (GEP-4894).
//
// # XMesh
//
// An XMesh whose controllerName is ControllerName is Accepted (or
// InvalidParameters when it has a parametersRef: sockmesh takes none) with
// SupportedFeatures, which lists only what sockmesh implements.
//
// # Workloads
//
// See workloads: every pod of Node.Name; enrolled when Pending or Running
// with IPs and not opted out with sockmesh.io/capture: disabled on the pod
// or its namespace; hostNetwork pods only with sockmesh.io/capture: enabled
// on the pod.
package translate
