package resolve

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// rrSpec is one resource record of a test reply: an address (A or AAAA by
// its family), a CNAME target, or, with neither, an SOA.
type rrSpec struct {
	name, cname string
	addr        netip.Addr
	ttl         uint32
}

// buildReply builds a reply to the question of name and qtype with rcode,
// the answers and the authorities given.
func buildReply(tb testing.TB, name string, qtype dnsmessage.Type, rcode dnsmessage.RCode, answers, authorities []rrSpec) []byte {
	tb.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, Response: true, RCode: rcode})
	b.EnableCompression()
	add := func(rrs []rrSpec) error {
		for _, rr := range rrs {
			hdr := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(rr.name), Class: dnsmessage.ClassINET, TTL: rr.ttl}
			var err error
			switch {
			case rr.cname != "":
				err = b.CNAMEResource(hdr, dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(rr.cname)})
			case rr.addr.Is4():
				err = b.AResource(hdr, dnsmessage.AResource{A: rr.addr.As4()})
			case rr.addr.Is6():
				err = b.AAAAResource(hdr, dnsmessage.AAAAResource{AAAA: rr.addr.As16()})
			default:
				err = b.SOAResource(hdr, dnsmessage.SOAResource{NS: dnsmessage.MustNewName("ns.test."),
					MBox: dnsmessage.MustNewName("admin.test."), MinTTL: rr.ttl / 2})
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	err := errors.Join(b.StartQuestions(),
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: qtype, Class: dnsmessage.ClassINET}),
		b.StartAnswers(), add(answers), b.StartAuthorities(), add(authorities))
	msg, ferr := b.Finish()
	if err = errors.Join(err, ferr); err != nil {
		tb.Fatalf("build reply: %v", err)
	}
	return msg
}

// parse runs parseReply on reply, asked for name and qtype.
func parse(reply []byte, name string, qtype dnsmessage.Type) (answer, error) {
	var p dnsmessage.Parser
	h, err := p.Start(reply)
	if err != nil {
		return answer{}, err
	}
	return parseReply(&p, h, dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: qtype, Class: dnsmessage.ClassINET})
}

// cnameChain returns n CNAMEs from www.test. on, each to the next name,
// the last one to end.
func cnameChain(n int, end string) []rrSpec {
	var rrs []rrSpec
	for i := range n {
		to := fmt.Sprintf("c%d.test.", i+1)
		if i == n-1 {
			to = end
		}
		from := "www.test."
		if i > 0 {
			from = fmt.Sprintf("c%d.test.", i)
		}
		rrs = append(rrs, rrSpec{name: from, cname: to, ttl: 60})
	}
	return rrs
}

// TestParseReplyCNAMEs: a chain of up to maxCNAMEs CNAMEs leads to its
// end's addresses; a longer one, or a loop, is no answer. Followed without
// a bound, a reply of looping CNAMEs took seconds to read.
func TestParseReplyCNAMEs(t *testing.T) {
	host := rrSpec{name: "host.test.", addr: netip.MustParseAddr("192.0.2.1"), ttl: 300}
	loop := []rrSpec{{name: "www.test.", cname: "b.test.", ttl: 60}, {name: "b.test.", cname: "www.test.", ttl: 60},
		{name: "www.test.", addr: netip.MustParseAddr("192.0.2.2"), ttl: 60}, {name: "b.test.", addr: netip.MustParseAddr("192.0.2.3"), ttl: 60}}
	for _, tc := range []struct {
		name    string
		answers []rrSpec
		want    []netip.Addr // nil: an error
	}{
		{"one CNAME", append(cnameChain(1, "host.test."), host), addrs("192.0.2.1")},
		{"16 CNAMEs", append(cnameChain(maxCNAMEs, "host.test."), host), addrs("192.0.2.1")},
		{"17 CNAMEs", append(cnameChain(maxCNAMEs+1, "host.test."), host), nil},
		{"a loop", loop, nil},
	} {
		a, err := parse(buildReply(t, "www.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, tc.answers, nil), "www.test.", dnsmessage.TypeA)
		switch {
		case tc.want == nil && err == nil:
			t.Errorf("%s: parseReply = %v, want an error", tc.name, a.addrs)
		case tc.want != nil && (err != nil || !slices.Equal(a.addrs, tc.want)):
			t.Errorf("%s: parseReply = %v, %v; want %v", tc.name, a.addrs, err, tc.want)
		}
	}
}

// TestParseReplyOtherType: records of a type not asked for are no answer
// to the question (NODATA here), as they are not for net.Resolver.
func TestParseReplyOtherType(t *testing.T) {
	reply := buildReply(t, "www.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess,
		[]rrSpec{{name: "www.test.", addr: netip.MustParseAddr("192.0.2.1"), ttl: 60}}, nil)
	if a, err := parse(reply, "www.test.", dnsmessage.TypeAAAA); err != nil || len(a.addrs) != 0 {
		t.Errorf("AAAA answered with an A record: parseReply = %v, %v; want no addresses", a.addrs, err)
	}
}

// FuzzParseReply feeds parseReply the replies a DNS server may send: it
// must not panic, and an answer holds only addresses of records of the
// question's type in the reply.
func FuzzParseReply(f *testing.F) {
	a, aaaa := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	soa := []rrSpec{{name: "test.", ttl: 3600}}
	for _, s := range []struct {
		qtype   dnsmessage.Type
		rcode   dnsmessage.RCode
		answers []rrSpec
		auth    []rrSpec
	}{
		{dnsmessage.TypeA, dnsmessage.RCodeSuccess, []rrSpec{{name: "www.test.", addr: a, ttl: 60}}, nil},
		{dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, []rrSpec{{name: "WWW.test.", addr: aaaa, ttl: 60}}, nil},
		{dnsmessage.TypeA, dnsmessage.RCodeSuccess, append(cnameChain(3, "host.test."), rrSpec{name: "host.test.", addr: a, ttl: 5}), nil},
		{dnsmessage.TypeA, dnsmessage.RCodeSuccess, []rrSpec{{name: "www.test.", cname: "www.test.", ttl: 60}}, nil},
		{dnsmessage.TypeA, dnsmessage.RCodeSuccess, nil, soa},
		{dnsmessage.TypeAAAA, dnsmessage.RCodeNameError, nil, soa},
		{dnsmessage.TypeA, dnsmessage.RCodeServerFailure, nil, nil},
	} {
		f.Add(buildReply(f, "www.test.", s.qtype, s.rcode, s.answers, s.auth), s.qtype == dnsmessage.TypeAAAA)
	}
	f.Fuzz(func(t *testing.T, reply []byte, v6 bool) {
		qtype := dnsmessage.TypeA
		if v6 {
			qtype = dnsmessage.TypeAAAA
		}
		got, err := parse(reply, "www.test.", qtype)
		if err != nil && !errors.Is(err, ErrNXDomain) {
			return
		}
		// The addresses of the question's type in the reply, read apart.
		var p dnsmessage.Parser
		var in []netip.Addr
		if _, err := p.Start(reply); err != nil {
			t.Fatalf("parseReply read a reply whose header does not parse: %v", err)
		}
		if err := p.SkipAllQuestions(); err != nil {
			t.Fatalf("parseReply read a reply whose questions do not parse: %v", err)
		}
		// NXDOMAIN's answers are skipped, not parsed (a compression
		// pointer is not followed): they may not parse, and give nothing.
		rrs, err := p.AllAnswers()
		if err != nil && len(got.addrs) > 0 {
			t.Fatalf("addresses %v from answers that do not parse: %v", got.addrs, err)
		}
		for _, rr := range rrs {
			switch body := rr.Body.(type) {
			case *dnsmessage.AResource:
				if rr.Header.Type == qtype {
					in = append(in, netip.AddrFrom4(body.A))
				}
			case *dnsmessage.AAAAResource:
				if rr.Header.Type == qtype {
					in = append(in, netip.AddrFrom16(body.AAAA).Unmap())
				}
			}
		}
		for _, addr := range got.addrs {
			if !slices.Contains(in, addr) {
				t.Fatalf("%s answer %v holds %v, of no %s record of the reply", qtype, got.addrs, addr, qtype)
			}
		}
		if errors.Is(err, ErrNXDomain) && len(got.addrs) > 0 {
			t.Fatalf("NXDOMAIN with addresses %v", got.addrs)
		}
	})
}
