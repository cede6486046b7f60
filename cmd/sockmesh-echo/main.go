// Command sockmesh-echo is the test backend of test/echo as a binary: HTTP/1.1,
// h2, h2c, gRPC, WebSocket and SSE on one port (TLS when given a certificate),
// and an optional raw TCP echo. Every HTTP answer is a JSON report of what the
// server saw; POD_NAMESPACE and POD_NAME name the workload in it.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/test/echo"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sockmesh-echo:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", ":8080", "HTTP/gRPC/WebSocket listen address")
	certFile := flag.String("tls-cert", "", "server certificate (PEM); with -tls-key, serve TLS")
	keyFile := flag.String("tls-key", "", "server private key (PEM)")
	clientCA := flag.String("client-ca", "", "CA bundle (PEM); when set, client certificates signed by it are required")
	tcpListen := flag.String("tcp-listen", "", "raw TCP echo listen address (TLS too when -tls-cert is set); empty: off")
	drain := flag.Duration("drain", 0, "on SIGTERM, go on serving this long before exiting, as an app that finishes its work when its pod terminates; 0: exit at once")
	flag.Parse()

	cfg := echo.Config{Namespace: os.Getenv("POD_NAMESPACE"), Pod: os.Getenv("POD_NAME")}
	if (*certFile == "") != (*keyFile == "") {
		return errors.New("-tls-cert and -tls-key go together")
	}
	if *certFile != "" {
		pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return fmt.Errorf("load server certificate: %w", err)
		}
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
		if *clientCA != "" {
			pem, err := os.ReadFile(*clientCA)
			if err != nil {
				return fmt.Errorf("read client ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("client ca %s: no certificate", *clientCA)
			}
			cfg.TLS.ClientCAs = pool
			cfg.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		}
	} else if *clientCA != "" {
		return errors.New("-client-ca needs -tls-cert")
	}
	errs := make(chan error, 3)
	if *drain > 0 {
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		go func() {
			<-term
			slog.Info("terminating: serving on", "for", drain.String())
			time.Sleep(*drain)
			errs <- nil
		}()
	}
	if *tcpListen != "" {
		l, err := net.Listen("tcp", *tcpListen)
		if err != nil {
			return fmt.Errorf("listen tcp echo: %w", err)
		}
		if cfg.TLS != nil {
			l = tls.NewListener(l, cfg.TLS)
		}
		slog.Info("tcp echo listening", "addr", l.Addr().String())
		go func() { errs <- echo.ServeTCPEcho(l) }()
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	slog.Info("echo listening", "addr", l.Addr().String(), "tls", cfg.TLS != nil)
	go func() { errs <- echo.New(cfg).Serve(l) }()
	return <-errs
}
