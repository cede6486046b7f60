package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sockmesh/sockmesh/agent/introspect"
)

// httpServers are the health and metrics servers (one when both listen on
// the same address).
type httpServers struct {
	srvs []*http.Server
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
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			hs.close()
			return nil, fmt.Errorf("%s listener: %w", strings.Join(sites[addr].names, " and "), err)
		}
		srv := &http.Server{
			Handler:           sites[addr].mux,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		}
		hs.srvs = append(hs.srvs, srv)
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

func (hs *httpServers) close() {
	for _, srv := range hs.srvs {
		srv.Close()
	}
}
