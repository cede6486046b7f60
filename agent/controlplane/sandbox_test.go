package controlplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/apiserver"
	"github.com/sockmesh/sockmesh/test/dnsserver"
)

// 10.234.0.0/16 belongs to these tests alone in this repository, and the
// test claims it on the machine (sandbox.ClaimAddrs), so that no concurrent
// test, nor a run of it from another checkout, makes the pod's address
// ambiguous.
var (
	sandboxPlan  = netip.MustParsePrefix("10.234.0.0/16")
	sandboxPodIP = netip.MustParseAddr("10.234.0.1")
)

// enrolments is the datapath's enrolment map.
type enrolments struct {
	mu   sync.Mutex
	last map[uint64]datapath.Proxy
}

func (e *enrolments) SetEnrolments(want map[uint64]datapath.Proxy) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.last = maps.Clone(want)
	return nil
}

func (e *enrolments) want(want map[uint64]datapath.Proxy) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !maps.Equal(e.last, want) {
		return fmt.Errorf("enrolments %v, want %v", e.last, want)
	}
	return nil
}

// TestSandboxRestartEnrolsTheNewNetns: the kubelet recreates a running
// pod's sandbox (its pause container died) and the pod keeps its IP, so only
// its PodReadyToStartContainers condition tells: False, then True with a
// new transition time once the new sandbox has its network. The pod is
// enrolled in its new network namespace then, not at the next verify (an
// hour here), while its connections went uncaptured.
func TestSandboxRestartEnrolsTheNewNetns(t *testing.T) {
	sandbox.ClaimAddrs(t, sandboxPlan)
	env := apiserver.Start(t)
	dns := dnsserver.Start(t)
	ctx := t.Context()
	kube := env.Kube
	must.Succeed(t)(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	// No controller-manager runs to create it, and pods need it.
	must.Succeed(t)(kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	must.Succeed(t)(kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}))
	pod := must.Value[*corev1.Pod](t)(kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: ns},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "localhost/none"}}},
	}, metav1.CreateOptions{}))
	// sandboxStatus writes the pod's status as the kubelet does.
	sandboxStatus := func(ready corev1.ConditionStatus, at time.Time) {
		t.Helper()
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: sandboxPodIP.String(),
			PodIPs: []corev1.PodIP{{IP: sandboxPodIP.String()}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: ready,
				LastTransitionTime: metav1.NewTime(at)}}}
		pod = must.Value[*corev1.Pod](t)(kube.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}))
	}
	start := time.Now().Add(-time.Hour)
	old := sandbox.NewNetNS(t)
	old.AddAddr(t, "lo", netip.PrefixFrom(sandboxPodIP, 32))
	sandboxStatus(corev1.ConditionTrue, start)

	a := startAgent(t, env, "agent-1", dns.Addr)
	proxy := datapath.Proxy{NetNSCookie: 1, V4: netip.MustParseAddrPort("10.234.255.1:15001")}
	dp := &enrolments{}
	en, err := enrol.New(enrol.Config{NodeProxy: proxy, Retry: 10 * time.Millisecond, Verify: time.Hour},
		dp, nil, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	runEnroller(t, a, en)
	oldCookie := must.Value[uint64](t)(old.Cookie())
	eventually(t, "the pod enrolled", func() error { return dp.want(map[uint64]datapath.Proxy{oldCookie: proxy}) })

	// The pause container dies: the kubelet reports the sandbox gone, tears
	// its network down (CNI deletes the interface: the old netns loses the
	// address) and creates a new sandbox with the same address.
	sandboxStatus(corev1.ConditionFalse, start.Add(time.Minute))
	if err := old.Do(func() error { return delAddr("lo", sandboxPodIP) }); err != nil {
		t.Fatal(err)
	}
	renewed := sandbox.NewNetNS(t)
	renewed.AddAddr(t, "lo", netip.PrefixFrom(sandboxPodIP, 32))
	sandboxStatus(corev1.ConditionTrue, start.Add(time.Minute+time.Second))
	newCookie := must.Value[uint64](t)(renewed.Cookie())
	eventually(t, "the pod enrolled in its new netns", func() error {
		return dp.want(map[uint64]datapath.Proxy{newCookie: proxy})
	})
}

// runEnroller feeds a's Snapshots to en, as the agent's apply loop does.
func runEnroller(t *testing.T, a *agent, en *enrol.Enroller) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { en.Run(ctx) })
	wg.Go(func() {
		for {
			s, updated := a.cp.Current()
			if s.Version > 0 {
				if err := en.Update(s); err != nil {
					t.Errorf("enrol update: %v", err)
				}
			}
			select {
			case <-updated:
			case <-ctx.Done():
				return
			}
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		en.Close()
	})
}

// delAddr removes ip/32 from dev in the calling thread's netns.
func delAddr(dev string, ip netip.Addr) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return err
	}
	return netlink.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}})
}
