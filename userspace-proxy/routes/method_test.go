package routes

import (
	"net/http"
	"net/url"
	"testing"
)

// TestMethodOf: an RFC 8441 extended CONNECT stands for the GET of an
// HTTP/1.1 Upgrade; any other request for its own method.
func TestMethodOf(t *testing.T) {
	tests := []struct {
		name   string
		major  int
		method string
		header http.Header
		want   string
	}{
		{"extended CONNECT", 2, http.MethodConnect, http.Header{":protocol": {"websocket"}}, http.MethodGet},
		{"plain CONNECT over HTTP/2", 2, http.MethodConnect, http.Header{}, http.MethodConnect},
		{"HTTP/1.1 CONNECT with a stray field", 1, http.MethodConnect, http.Header{":protocol": {"websocket"}}, http.MethodConnect},
		{"HTTP/1.1 Upgrade", 1, http.MethodGet, http.Header{"Upgrade": {"websocket"}}, http.MethodGet},
		{"HEAD", 2, http.MethodHead, http.Header{}, http.MethodHead},
	}
	for _, tc := range tests {
		r := &http.Request{ProtoMajor: tc.major, Method: tc.method, Header: tc.header, URL: &url.URL{Path: "/ws"}}
		if got := MethodOf(r); got != tc.want {
			t.Errorf("%s: MethodOf = %s, want %s", tc.name, got, tc.want)
		}
		if got := FromHTTP(r).Method; got != tc.want {
			t.Errorf("%s: FromHTTP(r).Method = %s, want %s", tc.name, got, tc.want)
		}
	}
}
