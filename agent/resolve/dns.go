package resolve

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// ErrNXDomain reports that the hostname does not exist.
var ErrNXDomain = errors.New("no such host")

// rcodeError reports that a server answered with an error code other than
// NXDOMAIN (SERVFAIL, REFUSED, ...): it could not say what the name holds.
type rcodeError struct {
	rcode dnsmessage.RCode
}

func (e *rcodeError) Error() string { return "server answered " + e.rcode.String() }

// answer is the outcome of looking up one record type of a hostname.
type answer struct {
	addrs []netip.Addr
	// ttl is the smallest TTL of the records used (or the negative-caching
	// TTL of the zone when there are none).
	ttl time.Duration
}

// families are the record types a lookup asks for, in the order of the
// results lookup returns.
var families = [...]dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA}

// result is one record type's answer, or why there is none: ErrNXDomain
// (with the negative TTL in the answer) or a failure to learn.
type result struct {
	answer
	err error
}

// client sends DNS queries to a list of servers.
type client struct {
	servers []string
	timeout time.Duration
	dial    func(ctx context.Context, network, address string) (net.Conn, error)
}

// lookup asks for host's A and AAAA records, following CNAMEs within each
// answer, and returns each type's result apart: one may fail while the
// other answers (servers that mishandle AAAA exist). A name that exists
// without records of a type is an empty answer, not an error. The error is
// for a host that is no DNS name.
func (c *client) lookup(ctx context.Context, host string) ([len(families)]result, error) {
	var out [len(families)]result
	name, err := dnsmessage.NewName(strings.TrimSuffix(host, ".") + ".")
	if err != nil {
		return out, fmt.Errorf("lookup %s: %w", host, err)
	}
	for i, qtype := range families {
		a, err := c.query(ctx, name, qtype)
		if err != nil {
			err = fmt.Errorf("lookup %s %s: %w", host, qtype, err)
		}
		out[i] = result{a, err}
	}
	return out, nil
}

// query asks each server in turn until one gives a usable reply.
func (c *client) query(ctx context.Context, name dnsmessage.Name, qtype dnsmessage.Type) (answer, error) {
	if len(c.servers) == 0 {
		return answer{}, errors.New("no dns server configured")
	}
	var errs []error
	for _, server := range c.servers {
		a, err := c.exchange(ctx, server, name, qtype)
		if err == nil || errors.Is(err, ErrNXDomain) {
			return a, err
		}
		errs = append(errs, fmt.Errorf("server %s: %w", server, err))
	}
	return answer{}, errors.Join(errs...)
}

func (c *client) exchange(ctx context.Context, server string, name dnsmessage.Name, qtype dnsmessage.Type) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	id := uint16(rand.Uint32())
	// The first two bytes are room for the TCP length prefix.
	b := dnsmessage.NewBuilder(make([]byte, 2, 514), dnsmessage.Header{ID: id, RecursionDesired: true})
	b.EnableCompression()
	q := dnsmessage.Question{Name: name, Type: qtype, Class: dnsmessage.ClassINET}
	if err := b.StartQuestions(); err != nil {
		return answer{}, fmt.Errorf("build query: %w", err)
	}
	if err := b.Question(q); err != nil {
		return answer{}, fmt.Errorf("build query: %w", err)
	}
	msg, err := b.Finish()
	if err != nil {
		return answer{}, fmt.Errorf("build query: %w", err)
	}
	reply, err := c.roundTrip(ctx, "udp", server, msg, id)
	if err != nil {
		return answer{}, err
	}
	var p dnsmessage.Parser
	h, err := p.Start(reply)
	if err != nil {
		return answer{}, fmt.Errorf("parse reply: %w", err)
	}
	if h.Truncated {
		// RFC 7766: a truncated UDP reply is retried over TCP.
		if reply, err = c.roundTrip(ctx, "tcp", server, msg, id); err != nil {
			return answer{}, err
		}
		if h, err = p.Start(reply); err != nil {
			return answer{}, fmt.Errorf("parse reply: %w", err)
		}
	}
	return parseReply(&p, h, q)
}

// roundTrip sends msg (with two spare leading bytes) and returns the reply
// that carries id.
func (c *client) roundTrip(ctx context.Context, network, server string, msg []byte, id uint16) ([]byte, error) {
	conn, err := c.dial(ctx, network, server)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", network, err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(deadline); err != nil {
			return nil, fmt.Errorf("set deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	if network == "tcp" {
		binary.BigEndian.PutUint16(msg, uint16(len(msg)-2))
		if _, err := conn.Write(msg); err != nil {
			return nil, fmt.Errorf("write query: %w", err)
		}
		var n [2]byte
		if _, err := io.ReadFull(conn, n[:]); err != nil {
			return nil, fmt.Errorf("read reply length: %w", err)
		}
		reply := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(conn, reply); err != nil {
			return nil, fmt.Errorf("read reply: %w", err)
		}
		if len(reply) < 2 || binary.BigEndian.Uint16(reply) != id {
			return nil, errors.New("reply id mismatch")
		}
		return reply, nil
	}

	if _, err := conn.Write(msg[2:]); err != nil {
		return nil, fmt.Errorf("write query: %w", err)
	}
	buf := make([]byte, 65535)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return nil, fmt.Errorf("read reply: %w", err)
		}
		// A datagram with another id is a late reply to an earlier query
		// or spoofing: keep waiting for ours.
		if n >= 2 && binary.BigEndian.Uint16(buf) == id {
			return buf[:n], nil
		}
	}
}

// maxCNAMEs bounds the CNAMEs a reply may chain, as resolvers bound theirs
// (BIND follows 16): a longer chain or a loop is no answer. Following one
// without a bound took the agent seconds for a 64 KiB reply of looping
// CNAMEs, from a server anyone owning a domain controls.
const maxCNAMEs = 16

// parseReply extracts the addresses for q from a reply whose header p has
// read.
func parseReply(p *dnsmessage.Parser, h dnsmessage.Header, q dnsmessage.Question) (answer, error) {
	if !h.Response {
		return answer{}, errors.New("reply is not a response")
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return answer{}, fmt.Errorf("parse questions: %w", err)
	}
	if len(qs) != 1 || !strings.EqualFold(qs[0].Name.String(), q.Name.String()) || qs[0].Type != q.Type {
		return answer{}, errors.New("reply answers another question")
	}
	switch h.RCode {
	case dnsmessage.RCodeSuccess:
	case dnsmessage.RCodeNameError:
		if err := p.SkipAllAnswers(); err != nil {
			return answer{}, fmt.Errorf("parse answers: %w", err)
		}
		ttl, err := negativeTTL(p)
		if err != nil {
			return answer{}, err
		}
		return answer{ttl: ttl}, ErrNXDomain
	default:
		return answer{}, &rcodeError{rcode: h.RCode}
	}
	rrs, err := p.AllAnswers()
	if err != nil {
		return answer{}, fmt.Errorf("parse answers: %w", err)
	}
	// Follow the CNAME chain from the question's name; only records of the
	// question's type on that chain count (a resolver may add unrelated
	// ones). Owner names are read once: each read allocates.
	names := make([]string, len(rrs))
	for i, rr := range rrs {
		names[i] = rr.Header.Name.String()
	}
	target := q.Name.String()
	var out answer
	first := true
	useTTL := func(ttl uint32) {
		if d := time.Duration(ttl) * time.Second; first || d < out.ttl {
			out.ttl, first = d, false
		}
	}
	for hops := 0; ; hops++ {
		next := ""
		for i, rr := range rrs {
			if c, ok := rr.Body.(*dnsmessage.CNAMEResource); ok && strings.EqualFold(names[i], target) {
				next = c.CNAME.String()
				useTTL(rr.Header.TTL)
			}
		}
		if next == "" {
			break
		}
		if hops == maxCNAMEs {
			return answer{}, fmt.Errorf("CNAME chain of %s: longer than %d or a loop", q.Name, maxCNAMEs)
		}
		target = next
	}
	for i, rr := range rrs {
		if rr.Header.Type != q.Type || !strings.EqualFold(names[i], target) {
			continue
		}
		switch body := rr.Body.(type) {
		case *dnsmessage.AResource:
			out.addrs = append(out.addrs, netip.AddrFrom4(body.A))
			useTTL(rr.Header.TTL)
		case *dnsmessage.AAAAResource:
			out.addrs = append(out.addrs, netip.AddrFrom16(body.AAAA).Unmap())
			useTTL(rr.Header.TTL)
		}
	}
	if len(out.addrs) == 0 {
		// NODATA: the name exists without records of this type.
		ttl, err := negativeTTL(p)
		if err != nil {
			return answer{}, err
		}
		out.ttl = ttl
	}
	return out, nil
}

// negativeTTL, called once the answers are read, returns how long a negative answer may be cached (RFC 2308: the
// smaller of the SOA record's TTL and its minimum field), zero without an SOA.
func negativeTTL(p *dnsmessage.Parser) (time.Duration, error) {
	auth, err := p.AllAuthorities()
	if err != nil {
		return 0, fmt.Errorf("parse authorities: %w", err)
	}
	for _, rr := range auth {
		if soa, ok := rr.Body.(*dnsmessage.SOAResource); ok {
			return time.Duration(min(rr.Header.TTL, soa.MinTTL)) * time.Second, nil
		}
	}
	return 0, nil
}

// systemServers reads the nameservers of /etc/resolv.conf (port 53).
func systemServers(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var servers []string
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				servers = append(servers, netip.AddrPortFrom(a.WithZone(""), 53).String())
			}
		}
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("read %s: no nameserver", path)
	}
	return servers, nil
}
