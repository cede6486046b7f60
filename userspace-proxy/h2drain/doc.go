// Package h2drain asks HTTP/2 clients whose connections the proxy relays
// to move their next streams to a new connection, with a GOAWAY frame the
// proxy slips in between the backend's frames.
//
// A relayed HTTP/2 connection (an h2c app to an h2 or h2c backend: a gRPC
// channel, say) reaches one endpoint for as long as it lives, as under
// kube-proxy, since the relay never looks at its streams. Without this, a
// client keeps sending every stream to the endpoint it first reached: to
// a pod that is terminating until the pod is killed under its streams,
// never to the pods a Deployment scaled up to, and with the TLS settings
// its connection began with, whatever the policy says since. A GOAWAY
// with the highest stream identifier and NO_ERROR (RFC 9113 §6.8, the
// graceful first step a server takes) lets the client's streams in flight
// finish and sends its next ones over a new connection, which the proxy
// balances afresh. The backend learns nothing of it: it still serves
// every stream the client opened.
//
// Conn looks at the backend-to-app direction only, and at frame headers:
// where each frame ends, whether a header block is still open (no frame
// may come between its parts), whether the backend sent its own GOAWAY
// (then the proxy's would raise the last stream identifier, which a client
// may take for a protocol error, so none is sent) and whether it has begun
// an answer (until then the client may not have sent its first request,
// and a GOAWAY makes Go's client fail it rather than send it again, so
// the proxy's waits for the backend's first HEADERS).
//
// Upstream does the same toward the proxy's own client: net/http's HTTP/2
// Transport, which reads a GOAWAY slipped into what a backend sends it as
// the backend's own, and closes that connection once its streams end. It
// is how the proxy sets one of the Transport's connections aside (its TLS
// settings changed, its certificate chain expired), net/http giving no
// hook for one connection of its pool. Upstream follows the Transport's
// frames as well: its GOAWAY need not wait for the backend's first
// HEADERS once the Transport has opened a stream, and it lets the
// Transport's next opening HEADERS pass its acknowledgement of a
// backend's SETTINGS, so that a stream Go's client opens over a limit it
// has just learned is refused, which the proxy sends again, rather than
// reset as a protocol error (settingsack.go).
package h2drain
