package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/test/bench/internal/fwdproxy"
)

// The child processes. Each runs inside its netns (and cgroup), so every
// socket it opens is native there: no setns on any hot path.

// serverRole answers framed requests: a 4-byte big-endian length, then that
// many bytes, which it sends back. Args: listen address.
func serverRole(args []string) error {
	ln, err := listenReady(args)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go echo(c)
	}
}

func echo(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	var hdr [4]byte
	buf := make([]byte, 64<<10)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[:]))
		if n > len(buf) {
			buf = make([]byte, n)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}

// proxyRole runs fwdproxy. Args: listen address, Service address, backend.
func proxyRole(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("want listen, service and backend addresses, got %q", args)
	}
	svc, err := netip.ParseAddrPort(args[1])
	if err != nil {
		return err
	}
	backend, err := netip.ParseAddrPort(args[2])
	if err != nil {
		return err
	}
	ln, err := listenReady(args[:1])
	if err != nil {
		return err
	}
	return fwdproxy.Serve(ln, fwdproxy.Config{
		Backends: map[netip.AddrPort]netip.AddrPort{svc: backend},
		OnError:  func(err error) { fmt.Fprintln(os.Stderr, "proxy:", err) },
	})
}

// listenReady listens on args[0] and tells the parent with "ready".
func listenReady(args []string) (net.Listener, error) {
	if len(args) < 1 {
		return nil, errors.New("want a listen address")
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		return nil, err
	}
	fmt.Println("ready")
	return ln, nil
}

// job is one measurement the parent asks a client for.
type job struct {
	Kind     string        // "conn": connections/s; "rtt": request round trip
	Target   string        // address the client dials
	Size     int           // request (and response) payload bytes
	Duration time.Duration // how long to measure
	Parallel int           // concurrent connections ("conn")
}

// result is a client's answer.
type result struct {
	Ops        int
	Seconds    float64
	P50        time.Duration // "rtt": median round trip
	Errors     int
	FirstError string
}

// clientRole reads jobs from stdin, one JSON per line, and answers each with
// one JSON line on stdout.
func clientRole([]string) error {
	fmt.Println("ready")
	dec := json.NewDecoder(os.Stdin)
	enc := json.NewEncoder(os.Stdout)
	for {
		var j job
		if err := dec.Decode(&j); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		var res result
		switch j.Kind {
		case "conn":
			res = measureConns(j)
		case "rtt":
			res = measureRTT(j)
		default:
			return fmt.Errorf("unknown job kind %q", j.Kind)
		}
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
}

// exchange sends one framed request of len(payload) bytes on c and reads the
// echo into buf.
func exchange(c net.Conn, req, buf []byte) error {
	if _, err := c.Write(req); err != nil {
		return err
	}
	_, err := io.ReadFull(c, buf[:len(req)-4])
	return err
}

func request(size int) []byte {
	req := make([]byte, 4+size)
	binary.BigEndian.PutUint32(req, uint32(size))
	return req
}

// measureConns opens, uses once and closes connections from j.Parallel
// goroutines for j.Duration.
func measureConns(j job) result {
	var (
		mu  sync.Mutex
		res result
		wg  sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(j.Duration)
	for range max(j.Parallel, 1) {
		wg.Go(func() {
			req, buf := request(j.Size), make([]byte, j.Size)
			ops, errs := 0, 0
			var first error
			for time.Now().Before(deadline) {
				err := func() error {
					c, err := net.DialTimeout("tcp", j.Target, 5*time.Second)
					if err != nil {
						return err
					}
					defer c.Close()
					return exchange(c, req, buf)
				}()
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
					continue
				}
				ops++
			}
			mu.Lock()
			res.Ops += ops
			res.Errors += errs
			if first != nil && res.FirstError == "" {
				res.FirstError = first.Error()
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	return res
}

// measureRTT sends requests one after the other on one connection.
func measureRTT(j job) result {
	c, err := net.DialTimeout("tcp", j.Target, 5*time.Second)
	if err != nil {
		return result{Errors: 1, FirstError: err.Error()}
	}
	defer c.Close()
	req, buf := request(j.Size), make([]byte, j.Size)
	for range 50 { // warm up: slow start, caches
		if err := exchange(c, req, buf); err != nil {
			return result{Errors: 1, FirstError: err.Error()}
		}
	}
	var rtts []time.Duration
	start := time.Now()
	deadline := start.Add(j.Duration)
	for time.Now().Before(deadline) {
		t0 := time.Now()
		if err := exchange(c, req, buf); err != nil {
			return result{Errors: 1, FirstError: err.Error()}
		}
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	return result{Ops: len(rtts), Seconds: time.Since(start).Seconds(), P50: rtts[len(rtts)/2]}
}
