package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/datapath/takeover"
)

// httpServers are the health and metrics servers (one when both listen on
// the same address).
type httpServers struct {
	srvs   []*http.Server
	health net.Addr // the health listener's bound address; nil when off
}

func startHTTP(s settings, healthHandler http.Handler, reg *introspect.Catalog, log *slog.Logger) (*httpServers, error) {
	type site struct {
		mux   *http.ServeMux
		names []string
	}
	sites := map[string]*site{}
	var order []string
	add := func(addr, name string, routes map[string]http.Handler) {
		if addr == "" {
			return
		}
		st, ok := sites[addr]
		if !ok {
			st = &site{mux: http.NewServeMux()}
			sites[addr] = st
			order = append(order, addr)
		}
		st.names = append(st.names, name)
		for pattern, h := range routes {
			st.mux.Handle(pattern, h)
		}
	}
	add(s.healthListen, "health", map[string]http.Handler{"/healthz": healthHandler, "/readyz": healthHandler})
	add(s.metricsListen, "metrics", map[string]http.Handler{
		"/metrics": promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn), Registry: reg,
		}),
	})

	hs := &httpServers{}
	for _, addr := range order {
		// A rolling update runs the next agent beside this one (host
		// network): it binds the same port and takes it over, so that the
		// kubelet's probes of the new pod reach the new agent.
		ln, err := takeover.Listen(context.Background(), nil, addr)
		if err != nil {
			hs.close()
			return nil, fmt.Errorf("%s listener: %w", strings.Join(sites[addr].names, " and "), err)
		}
		if err := takeover.Take(ln); err != nil {
			if slices.Contains(sites[addr].names, "health") {
				// The kubelet's probes would reach either agent: readiness
				// could pass on the old one's answer, and the DaemonSet stop
				// it before this one serves. Failing, this container is
				// restarted while the old agent serves on.
				ln.Close()
				hs.close()
				return nil, fmt.Errorf("health listener: %w (the kubelet's probes would reach the agent this one replaces too)", err)
			}
			log.Warn("cannot take the address over: while agents overlap, either may answer on it",
				"listener", strings.Join(sites[addr].names, " and "), "err", err)
		}
		srv := &http.Server{
			Handler:           sites[addr].mux,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		}
		hs.srvs = append(hs.srvs, srv)
		if slices.Contains(sites[addr].names, "health") {
			hs.health = ln.Addr()
		}
		for _, name := range sites[addr].names {
			log.Info("listening", "listener", name, "addr", ln.Addr().String())
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server failed", "addr", ln.Addr().String(), "err", err)
			}
		}()
	}
	return hs, nil
}

// healthAddr is the host:port at which this node's agents answer /healthz
// and /readyz (the newest of them, which took the address last): the
// health listener's address, or 127.0.0.1 for one on every address (Go's
// listener on [::] takes IPv4 too). Empty when health is off.
func (hs *httpServers) healthAddr() string {
	a, ok := hs.health.(*net.TCPAddr)
	if !ok {
		return ""
	}
	ip := a.IP
	if ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(a.Port))
}

func (hs *httpServers) close() {
	for _, srv := range hs.srvs {
		srv.Close()
	}
}
