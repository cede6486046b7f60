package nshttp

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// dialTimeout bounds a connect: a dropped SYN fails the request instead
// of hanging it until the client's timeout.
const dialTimeout = 5 * time.Second

// Transport dials every connection inside ns (nil: the caller's own
// namespace) and keeps none alive.
func Transport(ns *sandbox.NetNS) *http.Transport {
	return &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := &net.Dialer{Timeout: dialTimeout}
			if ns == nil {
				return d.DialContext(ctx, network, addr)
			}
			return ns.Dial(d, network, addr)
		},
	}
}

// Client makes requests from inside ns (nil: the caller's own namespace),
// a connection each, each bounded by timeout.
func Client(ns *sandbox.NetNS, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: Transport(ns)}
}
