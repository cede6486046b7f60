package translate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/utils"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// maxCookiePathLen is the CRD's limit on sessionPersistence.cookie.path.
const maxCookiePathLen = 1024

// sessionPersistence maps a Gateway API sessionPersistence to the
// Snapshot's, or says why it is invalid. owner names the object it belongs
// to: a cookie without a name gets one derived from it, stable across
// agents and restarts (the API asks for a unique generated name).
func sessionPersistence(sp *gwv1.SessionPersistence, owner snapshot.ObjectRef) (*snapshot.SessionPersistence, string) {
	if sp == nil {
		return nil, ""
	}
	out := &snapshot.SessionPersistence{Type: snapshot.SessionCookie}
	if sp.Type != nil && *sp.Type != "" {
		out.Type = snapshot.SessionPersistenceType(*sp.Type)
	}
	if sp.AbsoluteTimeout != nil {
		d, err := utils.ParseDuration(string(*sp.AbsoluteTimeout))
		if err != nil || *d <= 0 {
			return nil, fmt.Sprintf("sessionPersistence.absoluteTimeout %q is not a positive duration (GEP-2257, e.g. 1h30m)", *sp.AbsoluteTimeout)
		}
		out.AbsoluteTimeoutSeconds = int64((*d + time.Second - 1) / time.Second)
	}
	switch out.Type {
	case snapshot.SessionCookie:
		if sp.Header != nil {
			return nil, "sessionPersistence.header must not be set when type is Cookie"
		}
		// type defaults to Cookie before the CRD's rule "cookie must be
		// specified for Cookie type" runs: {} and {absoluteTimeout: 1h}
		// are refused.
		c := sp.Cookie
		if c == nil {
			return nil, "sessionPersistence.cookie is required when type is Cookie (the default)"
		}
		out.Name = "sockmesh-session-" + shortHash(owner.String())
		if c.Name != nil {
			// No Set-Cookie can carry a name that is not a token: the
			// proxy's cookie would be dropped, sessions left unpinned. The
			// CRD's CookieName refuses "" too (MinLength 1).
			if !validHeaderName(string(*c.Name)) {
				return nil, fmt.Sprintf("sessionPersistence.cookie.name %q is not a valid cookie name (an RFC 7230 token)", *c.Name)
			}
			out.Name = string(*c.Name)
		}
		// "implementations MUST default the cookie path to "/"": the CRD
		// does, but not every installed CRD version or a manifest does,
		// and a Set-Cookie without Path is scoped to the request's
		// directory, so sessions begun under /a/b would not reach /c.
		out.CookiePath = "/"
		if c.Path != nil {
			// The CRD's MaxLength counts characters, not bytes.
			if n := utf8.RuneCountInString(*c.Path); n > maxCookiePathLen {
				return nil, fmt.Sprintf("sessionPersistence.cookie.path is %d characters long, more than %d", n, maxCookiePathLen)
			}
			out.CookiePath = *c.Path
		}
		switch deref(c.LifetimeType) {
		case "", string(gwv1.SessionCookieLifetimeType):
		case string(gwv1.PermanentCookieLifetimeType):
			if out.AbsoluteTimeoutSeconds == 0 {
				return nil, "sessionPersistence.absoluteTimeout is required when cookie.lifetimeType is Permanent"
			}
			out.Permanent = true
		default:
			return nil, fmt.Sprintf("sessionPersistence.cookie.lifetimeType %q is not Permanent or Session", *c.LifetimeType)
		}
	case snapshot.SessionHeader:
		if sp.Cookie != nil {
			return nil, "sessionPersistence.cookie must not be set when type is Header"
		}
		if sp.Header == nil || sp.Header.Name == "" {
			return nil, "sessionPersistence.header.name is required when type is Header"
		}
		if !validHeaderName(string(sp.Header.Name)) {
			return nil, fmt.Sprintf("sessionPersistence.header.name %q is not a valid header name", sp.Header.Name)
		}
		if reservedSessionHeader(strings.ToLower(string(sp.Header.Name))) {
			return nil, fmt.Sprintf("sessionPersistence.header.name %q cannot carry a session: HTTP uses it for framing, the connection, the Host or cookies", sp.Header.Name)
		}
		out.Name = string(sp.Header.Name)
	default:
		return nil, fmt.Sprintf("sessionPersistence.type %q is not Cookie or Header", out.Type)
	}
	return out, ""
}

// reservedSessionHeader reports whether a Header session may not use
// name (lower case): the proxy sets the session header on every answer
// that starts one and reads it from every request, so one of these would
// break the message or the connection, or clash with what it stands for:
// those a filter may not change either (proxyOwnedHeaders: framing and
// connection-specific fields); RFC 9110 §7.2: Host routes the request;
// RFC 6265: Cookie and Set-Cookie carry the app's cookies, which one set
// would replace. Pseudo-header names (":authority") are no tokens and fail
// validHeaderName already.
func reservedSessionHeader(name string) bool {
	switch name {
	case "host", "cookie", "set-cookie":
		return true
	}
	return proxyOwnedHeaders[name] != ""
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:4])
}
