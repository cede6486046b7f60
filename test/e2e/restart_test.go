package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/internal/agentproc"
)

// attempt is one connection of the steady traffic.
type attempt struct {
	start, end time.Time
	err        error
	status     int
	sni        string // "" when the backend saw plaintext or nothing
}

// steady is a request every 10 ms to a TLS-only backend, recorded.
type steady struct {
	s        *scenario
	mu       sync.Mutex
	attempts []attempt
	stop     chan struct{}
	done     chan struct{}
}

const steadyHostname = "steady.e2e.test"

// steadyBackend is the TLS-only backend of the steady traffic. The
// kube-proxy stand-in would deliver any connection that bypassed the proxy
// in plaintext: checkNoPlaintext at the end tells.
func steadyBackend(s *scenario) (*backend, *service) {
	return s.trustedTLSBackend("steady", steadyHostname)
}

// startSteady sends client's requests to svc every 10 ms until the end and
// waits until they flow.
func startSteady(s *scenario, svc *service, client *http.Client, name string) *steady {
	st := &steady{s: s, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(st.done)
		tick := time.NewTicker(10 * time.Millisecond) // the traffic's pace, not a synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-st.stop:
				return
			case <-tick.C:
			}
			a := attempt{start: time.Now()}
			r, err := s.request(client, svc.url(false, httpsPort, fmt.Sprintf("/%s/%d", name, i)))
			a.end, a.err = time.Now(), err
			if r != nil {
				a.status = r.status
				if r.report.TLS != nil {
					a.sni = r.report.TLS.ServerName
				}
			}
			st.mu.Lock()
			st.attempts = append(st.attempts, a)
			st.mu.Unlock()
		}
	}()
	s.t.Cleanup(func() { st.end() })
	st.wait(name+" traffic before the restart", time.Now(), 20)
	return st
}

// wait waits until n attempts that started after since have ended.
func (st *steady) wait(what string, since time.Time, n int) {
	eventually(st.s.t, what, func() error {
		st.mu.Lock()
		defer st.mu.Unlock()
		got := 0
		for _, a := range st.attempts {
			if !a.start.Before(since) {
				got++
			}
		}
		if got < n {
			return fmt.Errorf("%d attempts", got)
		}
		return nil
	})
}

// end stops the traffic and returns what it recorded.
func (st *steady) end() []attempt {
	select {
	case <-st.stop:
	default:
		close(st.stop)
	}
	<-st.done
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.attempts
}

// ok: the backend answered in TLS.
func (a attempt) ok() bool {
	return a.err == nil && a.status == http.StatusOK && a.sni == steadyHostname
}

func (a attempt) String() string {
	return fmt.Sprintf("attempt at %s: status %d, SNI %q, %v", a.start.Format(time.StampMicro), a.status, a.sni, a.err)
}

// testRestart restarts the agent (SIGTERM, then a new process) under steady
// traffic. Capture stays pinned meanwhile and the Service fails closed, so
// every connection either reaches the backend in TLS or fails (refused, as
// a rule); once the new agent is ready, none is lost.
func testRestart(s *scenario) {
	b, svc := steadyBackend(s)
	st := startSteady(s, svc, s.httpClient(nil), "steady")
	stopAt := time.Now()
	if err := s.n.agent.stop(); err != nil {
		s.t.Fatal(err)
	}
	s.n.agent = s.n.startAgent(s.t)
	s.n.agent.waitReady(s.t)
	readyAt := time.Now()
	st.wait("steady traffic after the restart", readyAt, 50)

	// A connection that ended before SIGTERM, or began once the new agent
	// was ready, must have reached the backend in TLS. One in between may
	// also have been refused, reset or answered 5xx (fail closed), but
	// never answered by a backend that saw plaintext.
	var before, gap, refused, after int
	var bad []string
	for _, a := range st.end() {
		ok := a.ok()
		phase := "during the restart"
		switch {
		case a.end.Before(stopAt):
			before++
			phase = "before the restart"
		case !a.start.Before(readyAt):
			after++
			phase = "after the new agent was ready"
		default:
			gap++
			if errors.Is(a.err, syscall.ECONNREFUSED) {
				refused++
			}
			if a.err != nil || a.status >= 500 {
				ok = true
			}
		}
		if !ok {
			bad = append(bad, phase+", "+a.String())
		}
	}
	s.t.Logf("steady traffic: %d attempts before the restart, %d during it (%d refused), %d after; the agent was away for %s",
		before, gap, refused, after, readyAt.Sub(stopAt).Round(time.Millisecond))
	if len(bad) > 0 {
		s.t.Errorf("%d attempts went wrong, first ones:\n%s", len(bad), strings.Join(bad[:min(len(bad), 5)], "\n"))
	}
	if refused == 0 {
		s.t.Errorf("no connection was refused while no agent ran (%d attempts then): the fail-closed path went unexercised", gap)
	}
	s.checkNoPlaintext(b)
}

// testRollingRestart replaces the agent as the DaemonSet's rolling update
// does (maxSurge): the next agent starts beside the running one and, once
// ready, the old one gets SIGTERM and drains. Every request must reach the
// backend in TLS — none refused, reset or answered 5xx at any moment — on
// a new connection each and on one kept h2c connection, which the old
// agent asks to move (GOAWAY) as it stops.
func testRollingRestart(s *scenario) {
	b, svc := steadyBackend(s)
	fresh := startSteady(s, svc, s.httpClient(nil), "fresh")
	kept := startSteady(s, svc, s.h2cKeptClient(), "kept")
	old := s.n.agent
	next := s.n.startAgent(s.t)
	s.n.agent = next // the newest agent uninstalls at the end
	next.waitReady(s.t)
	readyAt := time.Now()
	// Once the new agent serves, new connections go to it, none to the old
	// one, which only finishes what it has (the kept connection).
	fresh.wait("new connections with both agents", readyAt, 5)
	oldServed, nextServed := old.served(s.t), next.served(s.t)
	fresh.wait("new connections with both agents", time.Now(), 20)
	if o, n := old.served(s.t)-oldServed, next.served(s.t)-nextServed; o != 0 || n < 20 {
		s.t.Errorf("while both agents ran, the old one served %v new connections and the new one %v: want all on the new one", o, n)
	}
	stopAt := time.Now()
	if err := old.stop(); err != nil {
		s.t.Fatal(err)
	}
	fresh.wait("new connections after the old agent stopped", time.Now(), 50)
	kept.wait("the kept connection's requests after the old agent stopped", time.Now(), 50)

	for _, c := range []struct {
		name string
		st   *steady
	}{{"new connections", fresh}, {"the kept h2c connection", kept}} {
		var bad []string
		attempts := c.st.end()
		for _, a := range attempts {
			if !a.ok() {
				bad = append(bad, a.String())
			}
		}
		s.t.Logf("%s: %d requests, the new agent ready %s before the old one was stopped",
			c.name, len(attempts), stopAt.Sub(readyAt).Round(time.Millisecond))
		if len(bad) > 0 {
			s.t.Errorf("%s: %d of %d requests went wrong while the agents overlapped, first ones:\n%s",
				c.name, len(bad), len(attempts), strings.Join(bad[:min(len(bad), 5)], "\n"))
		}
	}
	s.checkNoPlaintext(b)
}

// testNextAgentDies: a rolling update whose new agent dies once it has
// taken the node over, as a build that crashes would. The old agent, still
// running, takes the datapath back at its next heartbeat, so a Service
// created afterwards is captured on the node — its requests reach the
// backend in TLS — and new connections keep working throughout: the dead
// agent's listeners hand their waiting connections to the old one's.
func testNextAgentDies(s *scenario) {
	b, svc := steadyBackend(s)
	fresh := startSteady(s, svc, s.httpClient(nil), "fresh")
	old := s.n.agent
	next := s.n.startAgent(s.t)
	next.waitReady(s.t)
	fresh.wait("new connections with both agents", time.Now(), 20)
	// Requests in flight between the kill and its exit may fail.
	killAt := time.Now()
	if err := next.p.Cmd.Process.Kill(); err != nil {
		s.t.Fatal(err)
	}
	<-next.exited
	killedAt := time.Now()
	if _, err := old.Log.Wait(func(r agentproc.Record) bool {
		return r.Msg() == "the agent that took the datapath over has exited: this one runs it again"
	}); err != nil {
		s.t.Fatalf("the old agent did not take the datapath back: %v", err)
	}

	// Only an agent that writes the datapath can capture a new Service.
	const hostname = "late.e2e.test"
	late, lateSvc := s.trustedTLSBackend("late", hostname)
	s.checkTLS(s.get(lateSvc.url(false, httpsPort, "/late")), hostname)
	fresh.wait("new connections after the new agent died", time.Now(), 20)

	// A request in flight on the killed agent may fail; no other.
	var bad []string
	attempts := fresh.end()
	for _, a := range attempts {
		if !a.ok() && !(a.start.Before(killedAt) && a.end.After(killAt)) {
			bad = append(bad, a.String())
		}
	}
	if len(bad) > 0 {
		s.t.Errorf("%d of %d requests went wrong, first ones:\n%s", len(bad), len(attempts), strings.Join(bad[:min(len(bad), 5)], "\n"))
	}
	s.checkNoPlaintext(b)
	s.checkNoPlaintext(late)
}
