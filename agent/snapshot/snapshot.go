package snapshot

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Snapshot is one immutable version of the node's routing table.
//
// The exported slices are sorted (see New) so that a Snapshot marshals to the
// same YAML every time; lookups go through the index New builds. Callers must
// not modify a Snapshot, its slices or anything they point to.
type Snapshot struct {
	// Version increases by one with every Snapshot the agent publishes; 0 is
	// the empty snapshot a data plane starts with.
	Version uint64 `json:"version"`
	// Frontends are the captured Service ports.
	Frontends []Frontend `json:"frontends,omitempty"`
	// Backends are the destinations frontends and their routes lead to.
	Backends []Backend `json:"backends,omitempty"`
	// Workloads are the pods on this node, enrolled or not.
	Workloads []Workload `json:"workloads,omitempty"`

	byAddr     map[netip.AddrPort]*Frontend
	byBackend  map[BackendRef]*Backend
	byWorkload map[netip.Addr]*Workload
	hostNet    map[netip.Addr]bool
}

// ObjectRef names the Kubernetes object a piece of the Snapshot came from, for
// logs, metrics and explanations. Kind is empty for core Services.
type ObjectRef struct {
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (r ObjectRef) String() string {
	if r.Kind == "" {
		return r.Namespace + "/" + r.Name
	}
	return r.Kind + "/" + r.Namespace + "/" + r.Name
}

// FailurePolicy says what the datapath does with a captured connection when
// the proxy is not running.
type FailurePolicy string

const (
	// FailClosed keeps redirecting to the proxy when it is gone: the app gets
	// a refused connection, never a plaintext bypass. Required whenever the
	// backend demands TLS.
	FailClosed FailurePolicy = "FailClosed"
	// FailOpen stops redirecting once the proxy's heartbeat is stale, so the
	// app reaches the Service address directly.
	FailOpen FailurePolicy = "FailOpen"
)

// Frontend is one captured Service port: connections to any of Addresses on
// Port are redirected to the proxy, which sends them to Backend.
type Frontend struct {
	// Service is the Service this port belongs to.
	Service ObjectRef `json:"service"`
	// PortName is the Service port's name (may be empty for a single port).
	PortName string `json:"portName,omitempty"`
	// Port is the Service port clients connect to.
	Port uint16 `json:"port"`
	// Addresses are the Service's ClusterIPs (both families when dual-stack).
	Addresses []netip.Addr `json:"addresses"`
	// FailurePolicy applies in the datapath to every address of this port.
	FailurePolicy FailurePolicy `json:"failurePolicy"`
	// Backend is where a connection goes when no route says otherwise.
	Backend BackendRef `json:"backend"`
	// Routes is the port's GAMMA route table; nil when no HTTPRoute or
	// GRPCRoute attaches to it.
	Routes *RouteTable `json:"routes,omitempty"`
}

// BackendKind is the kind of object a backend stands for.
type BackendKind string

const (
	// KindService is a core Service port's endpoints.
	KindService BackendKind = "Service"
	// KindXBackend is a gateway.networking.x-k8s.io XBackend.
	KindXBackend BackendKind = "XBackend"
)

// BackendRef identifies a Backend within a Snapshot.
type BackendRef struct {
	Kind      BackendKind `json:"kind"`
	Namespace string      `json:"namespace"`
	Name      string      `json:"name"`
	// Port is the Service port (KindService) or the XBackend's port number.
	Port uint16 `json:"port"`
}

func (r BackendRef) String() string {
	return fmt.Sprintf("%s/%s/%s:%d", r.Kind, r.Namespace, r.Name, r.Port)
}

// Protocol is the protocol the proxy speaks to a backend.
type Protocol string

const (
	// ProtocolAuto: no backend property names a protocol, so the proxy keeps
	// whatever the app speaks (HTTP/1.1, h2 prior knowledge, or opaque TCP).
	ProtocolAuto Protocol = ""
	// ProtocolTCP: opaque bytes, never parsed.
	ProtocolTCP Protocol = "TCP"
	// ProtocolHTTP: HTTP, version negotiated by ALPN (h2 and http/1.1 offered).
	ProtocolHTTP Protocol = "HTTP"
	// ProtocolHTTP11: HTTP/1.1 only.
	ProtocolHTTP11 Protocol = "HTTP11"
	// ProtocolHTTP2: HTTP/2 over TLS (ALPN h2).
	ProtocolHTTP2 Protocol = "HTTP2"
	// ProtocolH2C: HTTP/2 with prior knowledge over cleartext
	// (appProtocol kubernetes.io/h2c, XBackend H2C).
	ProtocolH2C Protocol = "H2C"
	// ProtocolGRPC: gRPC, which is HTTP/2 (h2 over TLS, h2c without).
	ProtocolGRPC Protocol = "GRPC"
	// ProtocolWS: WebSocket over cleartext HTTP/1.1 (appProtocol kubernetes.io/ws).
	ProtocolWS Protocol = "WS"
	// ProtocolWSS: WebSocket over TLS with ALPN http/1.1
	// (appProtocol kubernetes.io/wss, XBackend WSS).
	ProtocolWSS Protocol = "WSS"
	// ProtocolMCP: Model Context Protocol, streamable HTTP with server-sent
	// events; responses must stream without buffering, and a session's
	// requests go to the endpoint that issued its Mcp-Session-Id.
	ProtocolMCP Protocol = "MCP"
)

// Backend is a destination and the properties of the wire to it.
type Backend struct {
	Ref BackendRef `json:"ref"`
	// Protocol toward the backend.
	Protocol Protocol `json:"protocol,omitempty"`
	// Endpoints to dial; the proxy never dials a Service address. For an
	// ExternalHostname XBackend these are the agent's vetted DNS answers.
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// Hostname is the external FQDN of an ExternalHostname XBackend; the
	// proxy uses it as Host authority where the app's own does not apply.
	Hostname string `json:"hostname,omitempty"`
	// TLS is nil when the wire to the backend is cleartext.
	TLS *TLS `json:"tls,omitempty"`
	// Invalid is non-nil when the backend's properties could not be applied:
	// the proxy must fail closed (HTTP 503 or a TCP reset), never fall back
	// to plaintext.
	Invalid *Invalid `json:"invalid,omitempty"`
	// SessionPersistence is nil when requests may go to any endpoint.
	SessionPersistence *SessionPersistence `json:"sessionPersistence,omitempty"`
	// ClientIPAffinitySeconds, when not 0, is the Service's sessionAffinity
	// ClientIP: a client's connections and requests go to the endpoint its
	// last one went to while it sends one at least this often (kube-proxy's
	// rule). Session persistence, when set, decides instead.
	ClientIPAffinitySeconds int32 `json:"clientIPAffinitySeconds,omitempty"`
	// RetryConstraint bounds the retries the proxy sends to this backend
	// (XBackendTrafficPolicy retryConstraint); nil leaves route rules'
	// retry attempts as the only bound.
	RetryConstraint *RetryConstraint `json:"retryConstraint,omitempty"`
	// Sources are the objects that shaped this backend (policies, XBackend;
	// the Service itself when its port's appProtocol chose Protocol), for
	// explanations.
	Sources []ObjectRef `json:"sources,omitempty"`
	// AppProtocol is that Service port's appProtocol (KEP-3726), for
	// explanations; empty when no appProtocol chose Protocol.
	AppProtocol string `json:"appProtocol,omitempty"`
}

// Endpoint is one address of a backend.
type Endpoint struct {
	Addr netip.AddrPort `json:"addr"`
	// Ready, Serving and Terminating mirror EndpointSlice conditions.
	Ready       bool   `json:"ready"`
	Serving     bool   `json:"serving"`
	Terminating bool   `json:"terminating,omitempty"`
	Zone        string `json:"zone,omitempty"`
	NodeName    string `json:"nodeName,omitempty"`
	// Pod is the endpoint's targetRef when it is a Pod.
	Pod *ObjectRef `json:"pod,omitempty"`
	// Fallback is, for a ready endpoint that topology hints leave to other
	// nodes or zones, its fallback level: FallbackZone for one in this
	// node's zone (another node's, under PreferSameNode), FallbackFar for
	// one elsewhere; 0 for the others. The proxy sends an endpoint
	// connections only while none of a lower level can take them (none
	// ready, or all ejected after failed connects), as a mesh's locality
	// failover does (Envoy's priority levels), or while every endpoint is
	// ejected, each then taking its turn (Envoy's panic).
	Fallback FallbackLevel `json:"fallback,omitempty"`
}

// FallbackLevel orders the endpoints topology hints leave to others
// (Endpoint.Fallback): a lower level is taken first.
type FallbackLevel uint8

const (
	// FallbackZone: the endpoint is in this node's zone.
	FallbackZone FallbackLevel = 1
	// FallbackFar: the endpoint is in another zone, or its zone is unknown.
	FallbackFar FallbackLevel = 2
)

// TLSMode is how the proxy authenticates toward the backend.
type TLSMode string

const (
	// TLSServerOnly verifies the backend's certificate.
	TLSServerOnly TLSMode = "ServerOnly"
	// TLSMutual also presents ClientCertificate (XBackend ClientAndServer).
	TLSMutual TLSMode = "ClientAndServer"
)

// SANType is the type of a subjectAltName to verify.
type SANType string

const (
	SANHostname SANType = "Hostname"
	SANURI      SANType = "URI"
)

// SubjectAltName is one acceptable identity of the backend's certificate.
type SubjectAltName struct {
	Type  SANType `json:"type"`
	Value string  `json:"value"`
}

// TLS is the origination the proxy performs toward a backend.
type TLS struct {
	Mode TLSMode `json:"mode"`
	// ServerName is sent as SNI and, when SubjectAltNames is empty, is the
	// name the backend's certificate must carry.
	ServerName string `json:"serverName"`
	// RootsPEM is the trust bundle (PEM); SystemRoots uses the platform's.
	// Exactly one of them is set.
	RootsPEM    string `json:"rootsPEM,omitempty"`
	SystemRoots bool   `json:"systemRoots,omitempty"`
	// SubjectAltNames, when set, replace ServerName for verification: the
	// certificate must carry at least one of them.
	SubjectAltNames []SubjectAltName `json:"subjectAltNames,omitempty"`
	// ClientCertificatePEM and ClientKeyPEM are presented in TLSMutual mode.
	ClientCertificatePEM string `json:"clientCertificatePEM,omitempty"`
	ClientKeyPEM         string `json:"clientKeyPEM,omitempty"`
	// MinVersion and MaxVersion are crypto/tls version numbers; 0 leaves
	// crypto/tls's default.
	MinVersion uint16 `json:"minVersion,omitempty"`
	MaxVersion uint16 `json:"maxVersion,omitempty"`
	// CipherSuites (TLS 1.2 only; crypto/tls fixes TLS 1.3's) and Curves;
	// empty leaves crypto/tls's defaults.
	CipherSuites []uint16      `json:"cipherSuites,omitempty"`
	Curves       []tls.CurveID `json:"curves,omitempty"`
	// ALPN, when set, narrows and orders the protocols a connection
	// offers to those of it the connection speaks; one speaking none of
	// them (opaque TCP) offers ALPN as is.
	ALPN []string `json:"alpn,omitempty"`
	// Policy is the object these settings came from.
	Policy ObjectRef `json:"policy"`
}

// Invalid records why a backend's properties cannot be honoured.
type Invalid struct {
	// Policy is the object at fault.
	Policy ObjectRef `json:"policy"`
	// Reason is the Gateway API condition reason (e.g. NoValidCACertificate).
	Reason string `json:"reason"`
	// Message is a human-readable explanation.
	Message string `json:"message"`
}

// SessionPersistenceType is how a session is identified.
type SessionPersistenceType string

const (
	SessionCookie SessionPersistenceType = "Cookie"
	SessionHeader SessionPersistenceType = "Header"
)

// SessionPersistence pins a client session to one endpoint.
type SessionPersistence struct {
	Type SessionPersistenceType `json:"type"`
	// Name of the cookie or header carrying the session.
	Name string `json:"name"`
	// AbsoluteTimeoutSeconds ends a session that long after it started; 0
	// when unset. The Gateway API (v1.7) has no idle timeout.
	AbsoluteTimeoutSeconds int64 `json:"absoluteTimeoutSeconds,omitempty"`
	// Permanent cookies carry an expiry; session cookies do not.
	Permanent bool `json:"permanent,omitempty"`
	// CookiePath is the cookie's Path attribute; empty means "/" (the
	// Gateway API default).
	CookiePath string `json:"cookiePath,omitempty"`
}

// RetryConstraint is a backend's retry budget (Gateway API
// XBackendTrafficPolicy retryConstraint). A retry to the backend is sent
// while, counting it, retries make up at most BudgetPercent of the
// requests sent in the last BudgetInterval (first tries and retries alike:
// the API's "percentage of active requests that may be made up of
// retries"), or while it stays within the minimum rate, MinRetryCount per
// MinRetryInterval: scaled to BudgetInterval when MinRetryInterval is
// shorter, counted over MinRetryInterval itself when it is longer (5 per
// minute allows 5 in any minute, not under one per 10 s). A retry beyond
// both is not sent: the client gets 503.
type RetryConstraint struct {
	// BudgetPercent is 0 to 100.
	BudgetPercent int `json:"budgetPercent"`
	// BudgetInterval is 1 s to 1 h.
	BudgetInterval Duration `json:"budgetInterval"`
	// MinRetryCount is at least 1 and MinRetryInterval above 0, at most
	// 1 h.
	MinRetryCount    int      `json:"minRetryCount"`
	MinRetryInterval Duration `json:"minRetryInterval"`
	// Policy is the XBackendTrafficPolicy these settings came from.
	Policy ObjectRef `json:"policy"`
}

// Workload is a pod on this node.
type Workload struct {
	Pod            ObjectRef    `json:"pod"`
	UID            string       `json:"uid"`
	ServiceAccount string       `json:"serviceAccount,omitempty"`
	IPs            []netip.Addr `json:"ips,omitempty"`
	HostNetwork    bool         `json:"hostNetwork,omitempty"`
	// SandboxReady is when the pod's sandbox last got its network (its
	// PodReadyToStartContainers condition turned True; zero while it is
	// not True). A later time means a new sandbox, in a new network
	// namespace, though the pod's IPs may be the same.
	SandboxReady time.Time `json:"sandboxReady,omitzero"`
	// Enrolled pods have their connections captured.
	Enrolled bool `json:"enrolled"`
	// NotEnrolled says why Enrolled is false (an opt-out label, host
	// network, no IP yet, a finished pod), for explanations.
	NotEnrolled string `json:"notEnrolled,omitempty"`
}

// New sorts the parts, checks that every frontend's backend (and every
// backend its routes name) exists and that no address is claimed twice, and returns the indexed Snapshot. It takes
// ownership of the slices.
func New(version uint64, frontends []Frontend, backends []Backend, workloads []Workload) (*Snapshot, error) {
	slices.SortFunc(frontends, func(a, b Frontend) int {
		return cmp.Or(cmp.Compare(a.Service.Namespace, b.Service.Namespace),
			cmp.Compare(a.Service.Name, b.Service.Name), cmp.Compare(a.Port, b.Port))
	})
	slices.SortFunc(backends, func(a, b Backend) int { return compareRefs(a.Ref, b.Ref) })
	slices.SortFunc(workloads, func(a, b Workload) int {
		return cmp.Or(cmp.Compare(a.Pod.Namespace, b.Pod.Namespace), cmp.Compare(a.Pod.Name, b.Pod.Name))
	})
	s := &Snapshot{
		Version:    version,
		Frontends:  frontends,
		Backends:   backends,
		Workloads:  workloads,
		byAddr:     make(map[netip.AddrPort]*Frontend),
		byBackend:  make(map[BackendRef]*Backend, len(backends)),
		byWorkload: make(map[netip.Addr]*Workload),
		hostNet:    make(map[netip.Addr]bool),
	}
	for i := range backends {
		b := &backends[i]
		if _, dup := s.byBackend[b.Ref]; dup {
			return nil, fmt.Errorf("backend %s listed twice", b.Ref)
		}
		s.byBackend[b.Ref] = b
	}
	for i := range frontends {
		f := &frontends[i]
		if _, ok := s.byBackend[f.Backend]; !ok {
			return nil, fmt.Errorf("frontend %s port %d: backend %s missing", f.Service, f.Port, f.Backend)
		}
		if f.Routes != nil {
			if err := s.checkRoutes(f); err != nil {
				return nil, err
			}
		}
		for _, a := range f.Addresses {
			ap := netip.AddrPortFrom(a.Unmap(), f.Port)
			if other, dup := s.byAddr[ap]; dup {
				return nil, fmt.Errorf("address %s claimed by %s and %s", ap, other.Service, f.Service)
			}
			s.byAddr[ap] = f
		}
	}
	// An address names the enrolled pod that alone holds it: only enrolled
	// pods' connections reach the proxy, and a finished pod keeps in its
	// status an address the node may have given to a new pod. The proxy
	// takes the client's namespace from it, and another namespace's
	// consumer routes must never apply to a client's requests (GEP-1294).
	// A host-network pod's addresses are the node's, from which every host
	// process connects too: they name no pod, even when one such pod alone
	// is enrolled (HostNetwork tells them).
	shared := map[netip.Addr]bool{}
	for i := range workloads {
		w := &workloads[i]
		if !w.Enrolled {
			continue
		}
		for _, ip := range w.IPs {
			ip = ip.Unmap()
			if w.HostNetwork {
				s.hostNet[ip] = true
				continue
			}
			if _, taken := s.byWorkload[ip]; taken {
				shared[ip] = true
			}
			s.byWorkload[ip] = w
		}
	}
	for ip := range shared {
		delete(s.byWorkload, ip)
	}
	return s, nil
}

// Empty returns the version-0 snapshot that captures nothing.
func Empty() *Snapshot {
	s, _ := New(0, nil, nil, nil)
	return s
}

// Frontend returns the captured Service port for an original destination.
func (s *Snapshot) Frontend(dst netip.AddrPort) (*Frontend, bool) {
	f, ok := s.byAddr[netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())]
	return f, ok
}

// Backend returns the backend a reference names.
func (s *Snapshot) Backend(ref BackendRef) (*Backend, bool) {
	b, ok := s.byBackend[ref]
	return b, ok
}

// Workload returns the enrolled local pod that owns ip; none when no
// enrolled pod or several hold it, or ip is the node's (HostNetwork).
func (s *Snapshot) Workload(ip netip.Addr) (*Workload, bool) {
	w, ok := s.byWorkload[ip.Unmap()]
	return w, ok
}

// ClientPod returns the pod of a client connecting from ip: pod when the
// listener names it (in-pod mode), else the workload holding ip
// (Workload); nil when neither names one.
func (s *Snapshot) ClientPod(ip netip.Addr, pod *ObjectRef) *ObjectRef {
	if pod != nil {
		return pod
	}
	if w, ok := s.Workload(ip); ok {
		return &w.Pod
	}
	return nil
}

// HostNetwork reports whether an enrolled host-network pod holds ip: it is
// then one of the node's own addresses, from which every process of the
// node's network namespace connects, whichever pod it belongs to.
func (s *Snapshot) HostNetwork(ip netip.Addr) bool {
	return s.hostNet[ip.Unmap()]
}

func compareRefs(a, b BackendRef) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace),
		cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port))
}
