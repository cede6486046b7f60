package httpapi

import (
	"bufio"
	"context"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// peer is who is on the other end of a unix socket connection, as the
// kernel says (SO_PEERCRED: the credentials at connect time).
type peer struct {
	uid, gid, pid int
}

type peerKey struct{}

// connContext records a unix connection's peer in its requests' context.
func connContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return ctx // no peer: refused below
	}
	return context.WithValue(ctx, peerKey{}, peer{uid: int(cred.Uid), gid: int(cred.Gid), pid: int(cred.Pid)})
}

// allowPeer admits root, the agent's own user and, when gid >= 0, members
// of that group (primary, or supplementary as /proc/<pid>/status lists
// them) on the unix socket. The socket's file mode keeps others from
// connecting at all; this check still holds if the mode is loosened by
// mistake.
func allowPeer(next http.Handler, gid int, self int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := r.Context().Value(peerKey{}).(peer)
		switch {
		case !ok:
			httpError(w, http.StatusForbidden, "the peer's credentials cannot be read")
			return
		case p.uid == 0 || p.uid == self:
		case gid >= 0 && (p.gid == gid || slices.Contains(groupsOf(p.pid), gid)):
		default:
			msg := fmt.Sprintf("uid %d is not allowed: the introspection API serves root", p.uid)
			if gid >= 0 {
				msg += fmt.Sprintf(" and members of group %d", gid)
			}
			httpError(w, http.StatusForbidden, msg)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// groupsOf reads a process's supplementary groups; none when it cannot.
func groupsOf(pid int) []int {
	if pid <= 0 {
		return nil
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Groups:")
		if !ok {
			continue
		}
		var out []int
		for _, g := range strings.Fields(rest) {
			if n, err := strconv.Atoi(g); err == nil {
				out = append(out, n)
			}
		}
		return out
	}
	return nil
}

// requireToken admits requests with "Authorization: Bearer <token>", the
// token read from path at each request (a rotated token applies at once).
func requireToken(next http.Handler, path string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want, err := os.ReadFile(path)
		token := strings.TrimSpace(string(want))
		if err != nil || token == "" {
			httpError(w, http.StatusServiceUnavailable, "the agent cannot read its token file")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sockmesh"`)
			httpError(w, http.StatusUnauthorized, "a valid bearer token is required")
			return
		}
		next.ServeHTTP(w, r)
	})
}
