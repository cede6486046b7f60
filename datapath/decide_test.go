package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// shims are the SEC("syscall") programs that run the C decisions on the
// maps of a real Datapath (BPF_PROG_TEST_RUN cannot run the hooks).
type shims struct {
	Decide *ebpf.Program `ebpf:"sm_test_decide"`
	Answer *ebpf.Program `ebpf:"sm_test_answer"`
}

// openWithShims opens a Datapath on a throwaway cgroup and bpffs, and loads
// the shims with the same load-time constants, sharing its maps.
func openWithShims(t *testing.T, cfg Config) (*Datapath, *shims) {
	t.Helper()
	cfg.BPFFS = sandbox.TempBPFFS(t)
	cfg.Cgroup = sandbox.NewCgroup(t).Path
	d, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Uninstall() })

	spec, err := loadSockmesh()
	if err != nil {
		t.Fatal(err)
	}
	if err := configure(spec, d.cfg, d.proxyNetNS); err != nil {
		t.Fatal(err)
	}
	var s shims
	err = spec.LoadAndAssign(&s, &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		sockmeshMapSmServices:  d.objs.SmServices,
		sockmeshMapSmNetns:     d.objs.SmNetns,
		sockmeshMapSmHeartbeat: d.objs.SmHeartbeat,
	}})
	if err != nil {
		t.Fatalf("load shims: %v", err)
	}
	t.Cleanup(func() { s.Decide.Close(); s.Answer.Close() })
	return d, &s
}

func TestDecide(t *testing.T) {
	const (
		proxyMark = 0x1234
		podA      = 1001 // enrolled with both families
		podV4     = 1002 // enrolled with an IPv4 listener only
		beat      = uint64(1_000_000 * time.Second)
		maxAge    = 5 * time.Second
	)
	d, s := openWithShims(t, Config{ProxyMark: proxyMark, HeartbeatMaxAge: maxAge})
	var (
		closed4 = netip.MustParseAddrPort("10.96.0.10:80")
		closed6 = netip.MustParseAddrPort("[fd00:96::10]:80")
		open4   = netip.MustParseAddrPort("10.96.0.11:80")
		open6   = netip.MustParseAddrPort("[fd00:96::11]:80")
		proxy4  = netip.MustParseAddrPort("10.0.0.1:15001")
		proxy6  = netip.MustParseAddrPort("[fd00::1]:15002")
	)
	if err := d.SetServices([]Service{{Addr: closed4}, {Addr: closed6}, {Addr: open4, FailOpen: true}, {Addr: open6, FailOpen: true}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Enrol(podA, Proxy{NetNSCookie: 7, V4: proxy4, V6: proxy6}); err != nil {
		t.Fatal(err)
	}
	if err := d.Enrol(podV4, Proxy{NetNSCookie: 7, V4: proxy4}); err != nil {
		t.Fatal(err)
	}
	// The netns this process opened the datapath in is the proxy's: its
	// marked sockets are the proxy's own. Enrolled, as a hostNetwork pod's.
	own := d.proxyNetNS
	if err := d.Enrol(own, Proxy{NetNSCookie: own, V4: proxy4, V6: proxy6}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		netns   uint64
		dst     netip.AddrPort
		proto   uint8 // 0 means TCP
		mark    uint32
		beat    uint64 // heartbeat in the map
		now     uint64
		want    Decision
		toProxy netip.AddrPort // when Redirected
	}{
		{name: "not enrolled", netns: 999, dst: closed4, beat: beat, now: beat, want: SkippedNotEnrolled},
		{name: "other port", netns: podA, dst: netip.AddrPortFrom(closed4.Addr(), 81), beat: beat, now: beat, want: SkippedNoService},
		{name: "other address", netns: podA, dst: netip.MustParseAddrPort("10.96.0.12:80"), beat: beat, now: beat, want: SkippedNoService},
		{name: "udp", netns: podA, dst: closed4, proto: unix.IPPROTO_UDP, beat: beat, now: beat, want: SkippedNoService},
		{name: "ipv4", netns: podA, dst: closed4, beat: beat, now: beat, want: Redirected, toProxy: proxy4},
		{name: "ipv6", netns: podA, dst: closed6, beat: beat, now: beat, want: Redirected, toProxy: proxy6},
		{name: "proxy mark", netns: own, dst: closed4, mark: proxyMark, beat: beat, now: beat, want: SkippedMarked},
		{name: "proxy mark ipv6", netns: own, dst: closed6, mark: proxyMark, beat: beat, now: beat, want: SkippedMarked},
		{name: "proxy's netns unmarked", netns: own, dst: closed4, beat: beat, now: beat, want: Redirected, toProxy: proxy4},
		{name: "other mark", netns: own, dst: closed4, mark: proxyMark | 0x10000, beat: beat, now: beat, want: Redirected, toProxy: proxy4},
		// Pods may set the proxy's mark too (CAP_NET_RAW, Linux 5.17).
		{name: "proxy mark in a pod", netns: podA, dst: closed6, mark: proxyMark, beat: beat, now: beat, want: Redirected, toProxy: proxy6},
		{name: "proxy mark in a pod, no listener", netns: podV4, dst: closed6, mark: proxyMark, beat: beat, now: beat, want: DeniedNoProxy},
		{name: "proxy mark in a pod, stale", netns: podA, dst: open4, mark: proxyMark, beat: beat, now: beat + uint64(maxAge) + 1, want: SkippedProxyStale},
		{name: "fail-open fresh", netns: podA, dst: open4, beat: beat, now: beat + uint64(time.Second), want: Redirected, toProxy: proxy4},
		{name: "fail-open at max age", netns: podA, dst: open4, beat: beat, now: beat + uint64(maxAge), want: Redirected, toProxy: proxy4},
		{name: "fail-open stale", netns: podA, dst: open6, beat: beat, now: beat + uint64(maxAge) + 1, want: SkippedProxyStale},
		{name: "fail-open never beaten", netns: podA, dst: open4, beat: 0, now: beat, want: SkippedProxyStale},
		{name: "fail-open beat after now", netns: podA, dst: open4, beat: beat, now: beat - 1, want: Redirected, toProxy: proxy4},
		{name: "fail-closed stale", netns: podA, dst: closed4, beat: beat, now: beat + uint64(time.Hour), want: Redirected, toProxy: proxy4},
		{name: "fail-closed never beaten", netns: podA, dst: closed6, beat: 0, now: beat, want: Redirected, toProxy: proxy6},
		{name: "marked beats stale", netns: own, dst: open4, mark: proxyMark, beat: 0, now: beat, want: SkippedMarked},
		{name: "no ipv6 listener, fail-closed", netns: podV4, dst: closed6, beat: beat, now: beat, want: DeniedNoProxy},
		{name: "no ipv6 listener, fail-open", netns: podV4, dst: open6, beat: beat, now: beat, want: SkippedNoProxy},
		{name: "ipv4 listener only", netns: podV4, dst: closed4, beat: beat, now: beat, want: Redirected, toProxy: proxy4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := uint32(0)
			if err := d.objs.SmHeartbeat.Put(&key, &tc.beat); err != nil {
				t.Fatal(err)
			}
			proto := tc.proto
			if proto == 0 {
				proto = unix.IPPROTO_TCP
			}
			fam := uint8(sockmeshSmFamilySM_FAMILY_V6)
			if tc.dst.Addr().Is4() {
				fam = uint8(sockmeshSmFamilySM_FAMILY_V4)
			}
			args := sockmeshSmDecideArgs{Flow: sockmeshSmFlow{
				NetnsCookie: tc.netns,
				NowNs:       tc.now,
				Daddr:       addrWords(tc.dst.Addr()),
				Dport:       htons(tc.dst.Port()),
				Proto:       proto,
				Family:      fam,
				Mark:        tc.mark,
			}}
			if _, err := s.Decide.Run(&ebpf.RunOptions{Context: &args, ContextOut: &args}); err != nil {
				t.Fatal(err)
			}
			if got := Decision(args.Decision); got != tc.want {
				t.Errorf("decide(%s) = %s, want %s", tc.dst, got, tc.want)
			}
			if tc.want != Redirected {
				return
			}
			got := netip.AddrPortFrom(wordsAddr(args.ProxyAddr), ntohs(args.ProxyPort))
			if got != tc.toProxy {
				t.Errorf("decide(%s) redirects to %s, want %s", tc.dst, got, tc.toProxy)
			}
		})
	}
}

func TestAnswer(t *testing.T) {
	_, s := openWithShims(t, Config{})
	const (
		v4 = sockmeshSmFamilySM_FAMILY_V4
		v6 = sockmeshSmFamilySM_FAMILY_V6
		// SO_ORIGINAL_DST (SOL_IP) and IP6T_SO_ORIGINAL_DST (SOL_IPV6) are both 80.
		origDst = unix.SO_ORIGINAL_DST
	)
	tests := []struct {
		name               string
		level, opt, bufLen int32
		family             sockmeshSmFamily
		want               sockmeshSmAnswer
	}{
		{"ipv4", unix.SOL_IP, origDst, unix.SizeofSockaddrInet4, v4, sockmeshSmAnswerSM_ANSWER_V4},
		{"ipv4 large buffer", unix.SOL_IP, origDst, 128, v4, sockmeshSmAnswerSM_ANSWER_V4},
		{"ipv4 short buffer", unix.SOL_IP, origDst, unix.SizeofSockaddrInet4 - 1, v4, sockmeshSmAnswerSM_ANSWER_NONE},
		{"ipv6", unix.SOL_IPV6, origDst, unix.SizeofSockaddrInet6, v6, sockmeshSmAnswerSM_ANSWER_V6},
		{"ipv6 short buffer", unix.SOL_IPV6, origDst, unix.SizeofSockaddrInet6 - 1, v6, sockmeshSmAnswerSM_ANSWER_NONE},
		{"ipv4 asked at SOL_IPV6", unix.SOL_IPV6, origDst, 128, v4, sockmeshSmAnswerSM_ANSWER_NONE},
		{"ipv6 asked at SOL_IP", unix.SOL_IP, origDst, 128, v6, sockmeshSmAnswerSM_ANSWER_NONE},
		{"nothing stored", unix.SOL_IP, origDst, 128, 0, sockmeshSmAnswerSM_ANSWER_NONE},
		{"other option", unix.SOL_IP, unix.IP_TOS, 128, v4, sockmeshSmAnswerSM_ANSWER_NONE},
		{"option 80 at SOL_SOCKET", unix.SOL_SOCKET, origDst, 128, v4, sockmeshSmAnswerSM_ANSWER_NONE},
		{"option 80 at SOL_TCP", unix.SOL_TCP, origDst, 128, v4, sockmeshSmAnswerSM_ANSWER_NONE},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := sockmeshSmAnswerArgs{Level: tc.level, Optname: tc.opt, BufLen: tc.bufLen, Family: tc.family}
			if _, err := s.Answer.Run(&ebpf.RunOptions{Context: &args, ContextOut: &args}); err != nil {
				t.Fatal(err)
			}
			if args.Answer != tc.want {
				t.Errorf("answer(level %d, opt %d, len %d, family %d) = %d, want %d",
					tc.level, tc.opt, tc.bufLen, tc.family, args.Answer, tc.want)
			}
		})
	}
}
