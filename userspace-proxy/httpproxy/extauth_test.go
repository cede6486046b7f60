package httpproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FuzzCheckAnswer gives an ext_authz server's answer message (the bytes
// of a CheckResponse, as decodeCheckResponse reads them) to checkAnswer
// about a bodiless request, as the HTTP/1 fast path reads one: allowed,
// the request as writeHead sends it to the backend must end where its
// head ends, with the app's authority (the server cannot frame the
// request, or a backend reads the next request on its connection as its
// body); denied, the client's answer has a status and no field the
// proxy's writers frame or hop by.
func FuzzCheckAnswer(f *testing.F) {
	header := func(k, v string, add bool) *corev3.HeaderValueOption {
		//lint:ignore SA1019 ext_authz servers still say append with it (applyHeaderOptions)
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v}, Append: wrapperspb.Bool(add)}
	}
	ok := func(headers ...*corev3.HeaderValueOption) *authv3.CheckResponse {
		return &authv3.CheckResponse{Status: &status.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{
			OkResponse: &authv3.OkHttpResponse{Headers: headers, HeadersToRemove: []string{"x-remove"}}}}
	}
	denied := func(code typev3.StatusCode, headers ...*corev3.HeaderValueOption) *authv3.CheckResponse {
		return &authv3.CheckResponse{Status: &status.Status{Code: int32(codes.PermissionDenied)}, HttpResponse: &authv3.CheckResponse_DeniedResponse{
			DeniedResponse: &authv3.DeniedHttpResponse{Status: &typev3.HttpStatus{Code: code}, Headers: headers, Body: "denied"}}}
	}
	for _, m := range []*authv3.CheckResponse{
		ok(header("x-user", "alice", false), header("x-a", "2", true)),
		// A server's Content-Length on a bodiless request.
		ok(header("content-length", "26", false)),
		ok(header("transfer-encoding", "chunked", false), header("host", "elsewhere", false)),
		ok(header("connection", "x-a", false), header("x-a", "1", false)),
		denied(typev3.StatusCode_Unauthorized, header("www-authenticate", "Bearer", false)),
		denied(0, header("content-length", "1", false), header("connection", "close", false)),
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	const next = "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
	f.Fuzz(func(t *testing.T, msg []byte) {
		frame := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))), msg...)
		resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/grpc"}, "Grpc-Status": {"0"}}}
		var out authv3.CheckResponse
		if decodeCheckResponse(resp, frame, &out) != nil {
			return // the call fails closed
		}
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET /p HTTP/1.1\r\nHost: a\r\nX-Remove: 1\r\nX-A: 1\r\n\r\n")))
		if err != nil {
			t.Fatal(err)
		}
		if a := checkAnswer(r, &out); a != nil {
			if a.status < 200 || a.status > 599 {
				t.Fatalf("denied with status %d", a.status)
			}
			for _, k := range append(hopByHop[:], "Content-Length") {
				if _, ok := a.header[k]; ok {
					t.Fatalf("denied with a %s field: %v", k, a.header)
				}
			}
			return
		}
		removeHopByHop(r.Header) // as h1Conn.prepare does
		var wire bytes.Buffer
		bw := bufio.NewWriter(&wire)
		if err := writeHead(bw, r, nil); err != nil || bw.Flush() != nil {
			t.Fatal(err)
		}
		sent := wire.String()
		br := bufio.NewReader(strings.NewReader(sent + next))
		got, err := http.ReadRequest(br)
		if err != nil {
			return // a value net/http refuses, as it would refuse it from net/http's writer
		}
		if body, _ := io.ReadAll(got.Body); len(body) > 0 || got.Host != "a" {
			t.Fatalf("allowed request reached the backend with host %q and body %q:\n%s", got.Host, body, sent)
		}
		if n, err := http.ReadRequest(br); err != nil || n.URL.Path != "/next" {
			t.Fatalf("the request after an allowed one is lost (%v):\n%s", err, sent)
		}
	})
}

// TestCopyAuthHeadersFraming: an HTTP authorization server's framing
// fields and Host reach no request, also when the filter allows them by
// name: the request keeps its own framing (framingField) and authority.
func TestCopyAuthHeadersFraming(t *testing.T) {
	for _, allowed := range [][]string{nil, {"content-length", "Transfer-Encoding", "X-User", "host"}} {
		dst := http.Header{"X-A": {"1"}}
		src := http.Header{"Content-Length": {"26"}, "Transfer-Encoding": {"chunked"}, "X-User": {"alice"}, "Host": {"elsewhere"}}
		copyAuthHeaders(dst, src, allowed)
		if want := (http.Header{"X-A": {"1"}, "X-User": {"alice"}}); !maps.EqualFunc(dst, want, slices.Equal) {
			t.Errorf("copyAuthHeaders(allowed %q) = %v, want %v", allowed, dst, want)
		}
	}
}
