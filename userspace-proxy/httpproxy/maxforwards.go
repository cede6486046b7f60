package httpproxy

import (
	"net/http"
	"net/http/httputil"
	"strconv"
)

// Max-Forwards (RFC 9110 §7.6.2): an intermediary that receives a TRACE or
// OPTIONS request with the field MUST update it before forwarding, and at
// zero MUST answer as the request's final recipient. Both front ends ask
// lastHop of every request, which costs other methods a comparison.

// lastHop reports whether r is a TRACE or OPTIONS request whose
// Max-Forwards is zero, which the proxy answers itself (finalAnswer). A
// larger one is decremented in place, for the backend; one that is not a
// single decimal number goes on as it came.
func lastHop(r *http.Request) bool {
	if r.Method != http.MethodOptions && r.Method != http.MethodTrace {
		return false
	}
	vv := r.Header["Max-Forwards"]
	if len(vv) != 1 {
		return false
	}
	n, err := strconv.ParseUint(vv[0], 10, 64)
	switch {
	case err != nil:
		return false
	case n == 0:
		return true
	}
	r.Header["Max-Forwards"] = []string{strconv.FormatUint(n-1, 10)}
	return false
}

// finalAnswer is the proxy's answer to r as its final recipient
// (lastHop), counted: an OPTIONS gets a 200 without content, a TRACE its
// own head as the proxy read it (RFC 9110 §9.3.8), without the fields
// that may carry credentials, which the final recipient SHOULD leave out.
func (h *Handler) finalAnswer(x *exchange, r *http.Request) localAnswer {
	h.m.request(x.fe, http.StatusOK, "none") // no backend answered
	if r.Method == http.MethodOptions {
		return localAnswer{status: http.StatusOK}
	}
	for _, k := range traceHidden {
		delete(r.Header, k)
	}
	head, _ := httputil.DumpRequest(r, false) // fails only reading the body
	return localAnswer{status: http.StatusOK, header: http.Header{"Content-Type": messageHTTP}, body: head}
}

var (
	traceHidden = [...]string{"Authorization", "Proxy-Authorization", "Cookie"}
	messageHTTP = []string{"message/http"}
)
