package translate

import (
	"strings"
	"testing"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// TestSessionHeaderNames: a Header session may use no field a filter may
// not change, nor Host or the cookie fields, in any case; other names are
// taken as they are.
func TestSessionHeaderNames(t *testing.T) {
	header := gwv1.HeaderBasedSessionPersistence
	session := func(name string) *gwv1.SessionPersistence {
		return &gwv1.SessionPersistence{Type: &header, Header: &gwv1.HeaderConfig{Name: gwv1.HeaderName(name)}}
	}
	var refused []string
	for name := range proxyOwnedHeaders {
		refused = append(refused, name, strings.ToUpper(name))
	}
	refused = append(refused, "Host", "cookie", "Set-Cookie")
	for _, name := range refused {
		if out, msg := sessionPersistence(session(name), snapshot.ObjectRef{}); out != nil || !strings.Contains(msg, "cannot carry a session") {
			t.Errorf("header %q: session %v, message %q; want it refused", name, out, msg)
		}
	}
	for _, name := range []string{"X-Session", "session-id"} {
		if out, msg := sessionPersistence(session(name), snapshot.ObjectRef{}); out == nil || out.Name != name {
			t.Errorf("header %q: session %v, message %q; want it taken", name, out, msg)
		}
	}
}
