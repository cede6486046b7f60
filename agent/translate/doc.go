// Package translate turns Kubernetes and Gateway API objects into a Snapshot
// and the status conditions those objects deserve.
//
// Translate is a pure function: objects in, Snapshot parts and status out. It
// must not use a client, read the clock (Input.Now is given), resolve names or
// touch the filesystem; everything it needs arrives in Input. Almost all policy
// logic lives here and is tested from YAML fixtures in testdata/ (see
// translate_test.go for the fixture format; go test ./agent/translate -update
// rewrites the goldens). It never panics on malformed objects, and its Result
// is sorted, so equal inputs marshal to equal bytes. Should a bug panic
// while it judges one object, that object alone is left as an invalid one
// of its kind, closed for what it governs (contain.go), and listed in
// Result.Failures.
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
//   - a mesh route (below) attaches to the port;
//   - an XBackendTrafficPolicy gives it session persistence (below);
//   - the Service stands for an XBackend (below).
//
// The Frontend's Backend is the Service port itself (kind Service) with
// endpoints from the EndpointSlices labelled kubernetes.io/service-name: the
// slice port with the Service port's name (its number is the resolved
// targetPort), IPv4 and IPv6 slices (FQDN slices are skipped), each
// endpoint's first address (kube-proxy ignores the others), conditions as
// the EndpointSlice API defines their nil values, zone, nodeName and Pod
// targetRef. Of those, the snapshot keeps the ones this node's proxy may
// use, as kube-proxy chooses them on this node (serviceEndpoints): with
// internalTrafficPolicy Local, this node's only; otherwise, when the
// EndpointSlice controller hinted every ready endpoint for a node or zone
// (trafficDistribution) and one for this node or its zone
// (Input.Node.Zone), the ready ones so hinted, the other ready ones
// marked Fallback, this node's zone's before the others (two levels under
// PreferSameNode): the proxy takes them only while none of the hinted ones,
// or of a lower level, takes connections. Endpoints not ready stay: the proxy falls back to
// those serving while terminating.
//
// Headless (clusterIP None) and ExternalName Services are never captured:
// sockmesh redirects connections by their destination, a ClusterIP, and
// clients of a headless Service dial pod IPs directly. A BackendTLSPolicy
// targeting one is Accepted=False/Invalid with that explanation, so the
// status never claims TLS that is not applied. When two malformed Services
// claim the same ClusterIP and port, the older Service keeps it.
//
// # Mesh routes (GAMMA: HTTPRoute, GRPCRoute with a Service parent)
//
// A parentRef with group "" and kind Service attaches a route to that
// Service's TCP ports: the one parentRef.port names and/or the one
// sectionName names (both must match), or every port. Requests are matched
// by the Service address the client dialled, never by Host: route
// hostnames are ignored (GEP-1294). A route in the Service's namespace is
// a producer route; one in another namespace a consumer route, which
// applies only to clients in its own namespace and replaces the producer
// routes for them (the sets are not merged). Each attached port gets a
// Frontend.Routes table: a producer set and one set per consumer
// namespace, each merging every route of its role. When HTTPRoutes and
// GRPCRoutes attach to the same port and role, the GRPCRoutes govern and
// the HTTPRoutes' parent entry says Conflicted for that port (GEP-1294);
// across roles there is no conflict, a consumer set of either kind
// replacing the producer set of either kind.
// Headless and ExternalName Services, missing Services and ports are
// NoMatchingParent. Ports routes attach to are captured.
//
// Matches are listed once per set, in precedence order (matchKey): Exact
// path; then PathPrefix and RegularExpression by length (an expression's
// without its anchors), PathPrefix first on a tie; method; header count;
// query param count; then the older route, namespace/name, rule order and
// match order. GRPCRoute: service characters, method characters (a
// regular expression's without its anchors), header count, then the same
// tie breaks;
// its service/method matches become paths ("/svc/method" Exact, "/svc"
// PathPrefix, or an anchored regular expression); an Exact service written
// fully qualified (".pkg.Svc") loses its leading dot, which gRPC paths
// never carry. Regular expressions are RE2 (Go's regexp) matching the
// whole value, checked here; the proxy compiles them once per snapshot. A
// GRPCRoute's service or method expression keeps that meaning inside the
// path expression: "^" and "$" at its edges are removed, and one elsewhere
// ("a*^b") drops the rule; it matches only the values it matches that
// hold no "/", so each matches its own segment, and one that matches only
// values with a "/" drops the rule, however "/" is written, as does one
// that matches nothing at all (an empty class: "[^\s\S]"), told apart
// (segmentRegex).
// A rule without matches matches every request; an HTTPRoute without
// rules gets the CRD's default rule.
//
// Rules keep their filters in the Snapshot: request and response header
// modifiers (rule and backendRef level; a GRPCRoute's binary "-bin"
// metadata values must be base64 as gRPC decodes it), RequestRedirect (scheme,
// hostname, path, port, statusCode), URLRewrite (hostname, path),
// RequestMirror (percent or fraction), and, for HTTPRoutes, CORS and
// ExternalAuth, HTTP and GRPC protocols (rule level only: a backendRef's
// fails its rule; its backendRef resolves as a mirror's, with
// ReferenceGrants and ResolvedRefs, but one that does not resolve fails
// the rule: its requests must not go unauthorized), timeouts
// (request, backendRequest; "0s" disables) and retry (attempts defaulting
// to 1, codes, backoff), plus route-inline sessionPersistence. What the
// CRD would refuse is checked again, since a cluster's CRDs may be of
// another version or channel (the file source admits objects with the
// v1.7.0 experimental CRDs). What it would refuse in the spec as a whole (a rule name that is
// no section name or repeats, a hostname that is no Hostname, references
// to one parent that disagree on giving sectionName and port or repeat
// one, more than 32 parentRefs, 16 hostnames or rules or 128 matches, an
// HTTPRoute's empty rules list) makes the route Accepted=False (UnsupportedValue) on every parent,
// routing nothing; hostnames are otherwise ignored. A rule whose matches
// are invalid is left out. A rule whose matches are valid but whose
// filters or settings cannot be honoured — including
// the ExtensionRef filter sockmesh does not implement — stays and answers 500 (a GRPCRoute's, UNAVAILABLE, as the
// API asks where it cannot route): a filter is never skipped. Status
// then follows the API's "Drop Rule(s)" form: Accepted=True with
// PartiallyInvalid=True (UnsupportedValue, or IncompatibleFilters for
// RequestRedirect with URLRewrite in one rule, a backendRef's redirect
// beside the rule's rewrite included). When no rule routes, Accepted=False
// with that reason, and rules that answer 500 still do so.
//
// backendRefs: core Services (port required; ExternalName is InvalidKind)
// and XBackends (group gateway.networking.x-k8s.io, no port), with weights
// (default 1, 0 gets nothing). A valid rule that forwards nothing (no
// redirect, no backendRef of weight above 0) answers 500 (UNAVAILABLE),
// and a GRPCRoute without rules matches no call (UNIMPLEMENTED), which the
// Accepted message says. A backendRef Service gets a Backend built
// exactly as a captured port's — endpoints, BackendTLSPolicy, appProtocol —
// whether or not it is captured itself; a Service annotated
// sockmesh.io/xbackend leads to its XBackend. A backendRef that does not
// resolve stays in the rule, Invalid, so its share of requests gets 500;
// ResolvedRefs=False says why: BackendNotFound, InvalidKind,
// RefNotPermitted, UnsupportedProtocol (gRPC, a GRPCRoute's or a GRPC
// ExternalAuth's, to an HTTP/1-only or TCP backend; a UDP or SCTP port; an
// appProtocol routes cannot send to, GEP-1911: kubernetes.io/wss, https or
// tls without a BackendTLSPolicy, or any but the HTTP-family names
// appProtocolProblem lists),
// or ReasonInvalidBackend (it resolves, but its TLS policy or
// XBackend is invalid: requests fail closed with 503, as without the
// route). A mirror whose backendRef does not resolve is dropped. A
// backendRef the CRD refuses (a Service without port, an XBackend with
// one; a mirror's or ExternalAuth's too) fails its rule, as the CRD's
// other refusals within a rule do.
//
// Cross-namespace backendRefs to Services need a ReferenceGrant in the
// backend's namespace (from the route's kind and namespace, to Service),
// unless the backendRef names one of the route's own parent Services. An
// XBackend in another namespace is RefNotPermitted, grant or not: GEP-4894
// says Backends MUST live in the namespace of the routes referencing them.
// GEP-1294 lets meshes skip grants when routes cannot reach further than
// clients could; sockmesh's proxy dials from the node, outside the
// client's NetworkPolicy, so it asks for grants — except toward a parent
// Service, which the client dials anyway (conformance MeshConsumerRoute).
//
// Status: one RouteParentStatus per distinct Service parentRef (a repeat,
// which the CRD refuses, gets none) that has room among RouteStatus's 32,
// other controllers' entries included, as for a policy's ancestors: a
// parent with an entry of ours keeps it, the others take the room left,
// in order; one without room is listed in Result.Unrepresented and still
// served. The parentRef as written, controllerName ControllerName, observedGeneration,
// conditions Accepted (Accepted, NoMatchingParent, UnsupportedValue,
// IncompatibleFilters, ReasonConflicted), ResolvedRefs, and
// PartiallyInvalid when some rules are dropped. Every route examined gets
// an entry, empty when it has no Service parent. XBackends gain the
// parents of accepted routes that lead to them as ancestors.
//
// # Failure policy
//
// A Frontend whose Backend has TLS or is Invalid is FailClosed: were the
// datapath to let connections bypass a dead proxy, they would reach the
// backend in plaintext. Elsewhere (h2c, ws, route parents, plaintext
// XBackends) either is safe, and the Service annotation
// sockmesh.io/failure-policy (FailOpen or FailClosed) chooses; the default
// is FailOpen, because the app then still reaches its Service, only
// without the proxy's help. Values are matched without regard to case;
// one the agent cannot read is FailClosed.
//
// # BackendTLSPolicy (gateway.networking.k8s.io/v1)
//
// Targets are core Services in the policy's namespace, with sectionName (the
// port's name) or without (every TCP port; UDP and SCTP ports are left alone
// and the Accepted message says so). targetRefs the CRD's rules refuse
// (more than 16; a Service named twice, or both whole and by a port; a
// group, kind or name its schema refuses) make the policy Invalid, as a
// manifest file may hold them. Trust comes from
// caCertificateRefs —
// ConfigMap ca.crt (Core), Secret ca.crt, certificates.k8s.io
// ClusterTrustBundle (GEP-5075, cluster-scoped) — or wellKnownCACertificates
// System; hostname is the SNI, and subjectAltNames (Hostname, URI) replace it
// for verification. Every PEM block must decode and be a certificate that
// parses (a corrupted or truncated one is no less invalid for the others);
// a reference none of whose certificates is valid at Input.Now is invalid
// too (ResolvedRefs reason CACertificateOutsideValidity, sockmesh's own:
// the API asks for one when an implementation checks expiry), since the
// proxy's chain verification would refuse it, and Result.ChangesAt is when
// a reference's judgement flips (one valid certificate keeps it valid: a
// bundle holds an old CA beside its successor while backends move). The
// valid references form one bundle, so a bad reference beside good ones sets
// ResolvedRefs=False but keeps Accepted=True (trusting fewer anchors never
// weakens verification). Options under sockmesh.io/ are listed in package
// tlsvalidation; an unknown sockmesh.io/ key, an unprefixed key (reserved
// for keys Gateway API defines; it defines none yet) or a bad value is
// Invalid, never silently ignored. So
// is what the CRD's limits refuse: more than 8 caCertificateRefs, 5
// subjectAltNames or 16 options, a name or URI over 253 bytes, an option
// value over 4096.
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
// has one; a targetRef of a kind sockmesh does not implement, neither a
// core Service nor an XBackend, gets none and takes no room: another
// implementation's ancestors are not ours to write), controllerName ControllerName, observedGeneration, and
// lastTransitionTime Input.Now (the status writer keeps older timestamps for
// unchanged conditions). Accepted: Accepted, Conflicted, NoValidCACertificate,
// Invalid or TargetNotFound; ResolvedRefs: ResolvedRefs,
// InvalidCACertificateRef, InvalidKind or CACertificateOutsideValidity. A
// PolicyStatus holds 16 ancestors,
// other controllers' entries included, and the API forbids adding to a full
// list: the policy is unimplementable for a target its status has no room
// for, which gets no entry and whose ports fail closed (a route leading to
// them has ResolvedRefs=False/InvalidBackend). A target with an entry of
// ours keeps it, full list or not; the others take the room left, in
// order. Every agent reads the room from the policy's status as its
// informer shows it, so all decide alike. Every case in which a policy cannot
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
// (XBackendNotFound). An XBackend is also reachable as a backendRef (group
// gateway.networking.x-k8s.io, kind XBackend) of a mesh route; the Backend
// entry is the same, keyed by {XBackend, namespace, name, port.number}.
//
// Ancestors (XBackend status): the Services that stand for the XBackend
// and the parent Services of accepted routes leading to it, group "", kind
// Service, those that have room among BackendStatus's 32, other
// controllers' entries included, as for a route's parents (one without
// room is listed in Result.Unrepresented and still leads to the XBackend).
// An XBackend nothing reaches has no ancestors. An
// ExternalHostname XBackend without TLS is Accepted, with a message saying
// its connections are cleartext (the API calls that insecure). Accepted=False
// reasons: Invalid (what the CRD's rules would have refused), NoValidCACertificate,
// EgressNotAllowed (not on Node.EgressAllow); ResolvedRefs=False:
// InvalidCACertificateRef, InvalidKind, CACertificateOutsideValidity,
// InvalidCertificateRef or RefNotPermitted (a clientCertificateRef to another namespace that no
// ReferenceGrant there allows). DNS answers are node-local and
// stay out of status: an unresolved name, or one whose every answer is
// refused, fails closed in this node's Snapshot only (reasons Unresolved,
// AddressesRefused).
//
// ExternalHostname: endpoints are Input.Resolved's answers on port.number,
// without loopback, link-local, unspecified, multicast and broadcast
// addresses, the clouds' metadata services outside link-local (AWS's IPv6
// one, Alibaba's, Azure's WireServer), the node's own, the pod, service
// and node ranges, and every Service ClusterIP, external IP and load-balancer IP and EndpointSlice
// endpoint address in Input (the API's confused-deputy warning: the proxy
// dials from the node, outside the pods' NetworkPolicies, and knows no pod
// range but Node.PodCIDRs and no other node but Node.NodeCIDRs and the
// hostNetwork endpoints); names that are IP addresses or inside
// cluster.local (or Node.ClusterDomain) are Invalid. EndpointSelector: see
// xbackend_selector.go for the generated headless Service and
// Result.EndpointSelectorServices. TLS None, ServerOnly or ClientAndServer
// uses the same validation code as BackendTLSPolicy, plus the client key
// pair from a Secret's tls.crt and tls.key: the key unencrypted, the
// certificate valid at Input.Now (Result.ChangesAt is when that judgement
// flips: its NotBefore, or just after its NotAfter). sessionPersistence
// maps to the Snapshot's (a cookie without a name gets a stable generated
// one).
//
// # XBackendTrafficPolicy (gateway.networking.x-k8s.io/v1alpha1)
//
// Targets are core Services and XBackends in the policy's namespace
// (xbackendtrafficpolicy.go). retryConstraint becomes the targeted
// Backend's RetryConstraint, with the CRD's defaults: budget percent 20
// over interval 10s (1s to 1h), minRetryRate 10 per 1s; the proxy
// enforces it on route rules' retries (503 once spent). The deprecated
// sessionPersistence becomes a Service backend's own session persistence
// (its ports are then captured, so direct clients keep their sessions),
// and an XBackend's when it has none: an XBackend's own sessionPersistence
// wins (GEP-4894), which the Accepted message says. A Service annotated
// sockmesh.io/xbackend and an ExternalName Service are Invalid targets.
//
// Precedence as for BackendTLSPolicy: among valid policies targeting the
// same object, the older wins, then namespace/name; the others are
// Conflicted there. What the CRD would refuse (percent outside 0-100,
// intervals out of range or not GEP-2257 durations, count outside
// 1-1000000, a bad sessionPersistence, more than 16 targetRefs, a target
// named twice or with a group, kind or name the schema refuses) makes the
// policy Invalid: it is applied nowhere and takes part in no conflict.
//
// Status: one PolicyAncestorStatus per distinct targetRef that has room in
// the policy's status, as for BackendTLSPolicy; the policy is not applied
// to a target without room. ancestorRef group "" kind Service, or group
// gateway.networking.x-k8s.io kind XBackend, in the policy's namespace;
// controllerName ControllerName, observedGeneration. Accepted: Accepted,
// Conflicted, Invalid or TargetNotFound; ResolvedRefs: ResolvedRefs, or
// InvalidKind for a target kind the schema refuses (then also Invalid). A
// well-formed target of another kind gets no entry, as for
// BackendTLSPolicy.
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
