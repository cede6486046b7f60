package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// attempt is one connection of the steady traffic.
type attempt struct {
	start, end time.Time
	err        error
	status     int
	sni        string // "" when the backend saw plaintext or nothing
}

// testRestart restarts the agent (SIGTERM, a new process) under steady
// traffic, a new connection every 10 ms, to a TLS-only backend. Capture
// stays pinned meanwhile and the Service fails closed, so every connection
// either reaches the backend in TLS or fails (refused, as a rule); once the
// new agent is ready, none is lost. The kube-proxy stand-in would deliver any connection
// that bypassed the proxy in plaintext: the backend counts none.
func testRestart(s *scenario) {
	const hostname = "steady.e2e.test"
	ca := s.newCA()
	b, svc := s.tlsBackend("steady", s.serverCert(ca, hostname))
	s.apply(caConfigMap("steady-ca", ca) + tlsPolicy("steady", "steady", `    hostname: `+hostname+`
    caCertificateRefs: [{group: "", kind: ConfigMap, name: steady-ca}]`))
	s.waitCaptured(svc.addr(false, httpsPort), originatesTLS(hostname))

	var (
		mu       sync.Mutex
		attempts []attempt
		stop     = make(chan struct{})
		done     = make(chan struct{})
	)
	client := s.httpClient(nil)
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond) // the traffic's pace, not a synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			a := attempt{start: time.Now()}
			r, err := s.request(client, svc.url(false, httpsPort, fmt.Sprintf("/steady/%d", i)))
			a.end, a.err = time.Now(), err
			if r != nil {
				a.status = r.status
				if r.report.TLS != nil {
					a.sni = r.report.TLS.ServerName
				}
			}
			mu.Lock()
			attempts = append(attempts, a)
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-done:
		default:
			close(stop)
			<-done
		}
	}()
	// count counts the attempts that started after since and have ended.
	count := func(since time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range attempts {
			if !a.start.Before(since) {
				n++
			}
		}
		return n
	}
	begin := time.Now()
	eventually(s.t, "steady traffic before the restart", func() error {
		if n := count(begin); n < 20 {
			return fmt.Errorf("%d attempts", n)
		}
		return nil
	})

	stopAt := time.Now()
	if err := s.n.agent.stop(); err != nil {
		s.t.Fatal(err)
	}
	s.n.agent = s.n.startAgent(s.t)
	s.n.agent.waitReady(s.t)
	readyAt := time.Now()
	eventually(s.t, "steady traffic after the restart", func() error {
		if n := count(readyAt); n < 50 {
			return fmt.Errorf("%d attempts", n)
		}
		return nil
	})
	close(stop)
	<-done

	// A connection that ended before SIGTERM, or began once the new agent
	// was ready, must have reached the backend in TLS. One in between may
	// also have been refused, reset or answered 5xx (fail closed), but
	// never answered by a backend that saw plaintext.
	var before, gap, refused, after int
	var bad []string
	for _, a := range attempts {
		ok := a.err == nil && a.status == http.StatusOK && a.sni == hostname
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
			bad = append(bad, fmt.Sprintf("%s, attempt at %s: status %d, SNI %q, %v",
				phase, a.start.Format(time.StampMicro), a.status, a.sni, a.err))
		}
	}
	s.t.Logf("steady traffic: %d attempts before the restart, %d during it (%d refused), %d after; the agent was away for %s",
		before, gap, refused, after, readyAt.Sub(stopAt).Round(time.Millisecond))
	if len(bad) > 0 {
		s.t.Errorf("%d of %d attempts went wrong, first ones:\n%s", len(bad), len(attempts), strings.Join(bad[:min(len(bad), 5)], "\n"))
	}
	if refused == 0 {
		s.t.Errorf("no connection was refused while no agent ran (%d attempts then): the fail-closed path went unexercised", gap)
	}
	s.checkNoPlaintext(b)
}
