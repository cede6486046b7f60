package dnsserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Record is what a name holds: addresses, or a CNAME to another name.
type Record struct {
	Addrs []netip.Addr
	CNAME string
	TTL   uint32
}

// Server answers from its records. The zero value has no records; use
// Start or ServeConn.
type Server struct {
	// Addr is the "127.0.0.1:port" Start listens on (UDP and TCP).
	Addr string
	// TruncateUDP answers every UDP query with an empty, truncated reply,
	// so clients must retry over TCP.
	TruncateUDP bool
	// NegativeTTL is the SOA minimum returned with NXDOMAIN and NODATA.
	NegativeTTL uint32

	mu      sync.Mutex
	records map[string]Record
	queries map[string]int
	tcp     map[string]int
}

// Start serves on a free loopback port until t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{}
	var udp net.PacketConn
	var tcp net.Listener
	// UDP and TCP must share the port number; another process may take
	// the TCP side between the two listens, so try a few ports.
	for attempt := 0; ; attempt++ {
		var err error
		if udp, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatalf("listen udp: %v", err)
		}
		if tcp, err = net.Listen("tcp", udp.LocalAddr().String()); err == nil {
			break
		}
		udp.Close()
		if attempt == 5 {
			t.Fatalf("listen tcp: %v", err)
		}
	}
	s.Addr = udp.LocalAddr().String()
	var wg sync.WaitGroup
	wg.Go(func() { s.serveUDP(udp) })
	wg.Go(func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				s.ServeConn(c, true)
			})
		}
	})
	t.Cleanup(func() {
		udp.Close()
		tcp.Close()
		wg.Wait()
	})
	return s
}

// Set makes name (without the trailing dot) resolve to addrs.
func (s *Server) Set(name string, ttl uint32, addrs ...netip.Addr) {
	s.put(name, Record{Addrs: addrs, TTL: ttl})
}

// SetCNAME makes name an alias of target.
func (s *Server) SetCNAME(name, target string, ttl uint32) {
	s.put(name, Record{CNAME: target, TTL: ttl})
}

// Queries returns how many questions for name (any type) the server has
// answered, and how many of them came over TCP.
func (s *Server) Queries(name string) (total, overTCP int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[canonical(name)], s.tcp[canonical(name)]
}

func (s *Server) put(name string, r Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.records == nil {
		s.records = make(map[string]Record)
	}
	s.records[canonical(name)] = r
}

func canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, ".")) + "."
}

// ServePacket answers the queries that arrive on pc, one per datagram, until
// pc closes. With ServeConn for TCP it serves a Server on sockets the caller
// opened itself (e.g. inside another network namespace).
func (s *Server) ServePacket(pc net.PacketConn) { s.serveUDP(pc) }

func (s *Server) serveUDP(pc net.PacketConn) {
	buf := make([]byte, 65535)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		reply, err := s.answer(buf[:n], false)
		if err != nil {
			continue
		}
		pc.WriteTo(reply, addr)
	}
}

// ServeConn answers the queries that arrive on c until it fails or closes:
// length-prefixed messages when stream is set (TCP), otherwise one message
// per Read and Write, as over UDP.
func (s *Server) ServeConn(c net.Conn, stream bool) {
	buf := make([]byte, 65535)
	for {
		var msg []byte
		if stream {
			var n [2]byte
			if _, err := io.ReadFull(c, n[:]); err != nil {
				return
			}
			msg = buf[:binary.BigEndian.Uint16(n[:])]
			if _, err := io.ReadFull(c, msg); err != nil {
				return
			}
		} else {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			msg = buf[:n]
		}
		reply, err := s.answer(msg, stream)
		if err != nil {
			return
		}
		if stream {
			reply = append(binary.BigEndian.AppendUint16(nil, uint16(len(reply))), reply...)
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

// answer builds the reply to one query.
func (s *Server) answer(query []byte, overTCP bool) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, fmt.Errorf("parse query: %w", err)
	}
	q, err := p.Question()
	if err != nil {
		return nil, fmt.Errorf("parse question: %w", err)
	}
	name := strings.ToLower(q.Name.String())

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queries == nil {
		s.queries, s.tcp = make(map[string]int), make(map[string]int)
	}
	s.queries[name]++
	if overTCP {
		s.tcp[name]++
	}

	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	truncate := s.TruncateUDP && !overTCP
	rh.Truncated = truncate
	type rr struct {
		name string
		rec  Record
	}
	var chain []rr
	cur := name
	for range 8 {
		rec, ok := s.records[cur]
		if !ok {
			break
		}
		chain = append(chain, rr{cur, rec})
		if rec.CNAME == "" {
			break
		}
		cur = canonical(rec.CNAME)
	}
	if len(chain) == 0 {
		rh.RCode = dnsmessage.RCodeNameError
	}

	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	wrote := false
	for _, e := range chain {
		if truncate {
			break
		}
		hdr := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(e.name), Class: dnsmessage.ClassINET, TTL: e.rec.TTL}
		if e.rec.CNAME != "" {
			err = b.CNAMEResource(hdr, dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(canonical(e.rec.CNAME))})
		} else {
			for _, a := range e.rec.Addrs {
				switch {
				case a.Is4() && q.Type == dnsmessage.TypeA:
					err = errors.Join(err, b.AResource(hdr, dnsmessage.AResource{A: a.As4()}))
					wrote = true
				case a.Is6() && q.Type == dnsmessage.TypeAAAA:
					err = errors.Join(err, b.AAAAResource(hdr, dnsmessage.AAAAResource{AAAA: a.As16()}))
					wrote = true
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("build answer: %w", err)
		}
	}
	if !wrote && !truncate {
		if err := b.StartAuthorities(); err != nil {
			return nil, err
		}
		zone := dnsmessage.MustNewName(".")
		err := b.SOAResource(
			dnsmessage.ResourceHeader{Name: zone, Class: dnsmessage.ClassINET, TTL: 3600},
			dnsmessage.SOAResource{NS: dnsmessage.MustNewName("ns.test."), MBox: dnsmessage.MustNewName("admin.test."),
				Serial: 1, Refresh: 60, Retry: 60, Expire: 600, MinTTL: s.NegativeTTL})
		if err != nil {
			return nil, fmt.Errorf("build soa: %w", err)
		}
	}
	return b.Finish()
}
