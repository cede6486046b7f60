package e2ecluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sockmesh/sockmesh/test/cluster/node"
)

// rolloutUnderTraffic runs change, a change of the agent's DaemonSet, while
// the app calls the TLS Service every 20 ms, each call a new connection.
// The rolling update starts the next agent beside the running one
// (maxSurge), which takes the proxy's addresses and the datapath over once
// ready; the old one then drains. Not one call may fail: refused, reset,
// 5xx or plaintext. With surge false, change deletes the agent's pod: the
// DaemonSet's replacement starts while the old agent serves on
// (--handover-wait), its pod terminating from the start.
func rolloutUnderTraffic(t *testing.T, n *node.Node, w workloads, what string, surge bool, change func()) {
	t.Helper()
	before := agentPods(t, n)
	// Every agent pod's log from its start, and when each turned Ready
	// and was deleted: what explains a failed call, the old pods'
	// included, which are gone by the time the calls are judged.
	agents := watchAgents(t, n)
	var (
		mu       sync.Mutex
		calls    int
		failures []string
		stop     = make(chan struct{})
		done     = make(chan struct{})
	)
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond) // the traffic's pace, not a synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			at := time.Now()
			res, err := call(context.Background(), w.app, Call{URL: fmt.Sprintf("http://%s/rollout/%d", w.tlsVIP, i), Mode: "http1"})
			if err == nil && res.Error != "" {
				err = fmt.Errorf("app: %s", res.Error)
			}
			if err == nil {
				err = tlsAnswer(res)
			}
			mu.Lock()
			calls++
			if err != nil {
				failures = append(failures, fmt.Sprintf("call at %s: %v", at.UTC().Format(clock), err))
			}
			mu.Unlock()
		}
	}()
	finish := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}
	defer finish()

	start := time.Now()
	change()
	waitDaemonSetReady(t, n, agentNS, agentDS, 3*time.Minute)
	// Until the old agent has drained and exited: its listener closing is
	// part of what must lose nothing.
	waitAgentsGone(t, n, before, agents)
	// Traffic on the new agent alone: calls made after the old ones left.
	mu.Lock()
	gone := calls
	mu.Unlock()
	waitFor(t, time.Minute, "calls to the new agent alone", func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if after := calls - gone; after < 20 {
			return fmt.Errorf("%d calls since the old agent pods left", after)
		}
		return nil
	}, nil)
	finish()
	overlap := agents.stop()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%s: %d calls in %s, %d failed; at most %d agent pods running at once; timeline:\n%s", what, calls,
		time.Since(start).Round(time.Millisecond), len(failures), overlap, agents.timeline())
	if surge && overlap < 2 {
		t.Errorf("%s: the next agent never ran beside the old one (at most %d running at once): the DaemonSet did not surge\n%s",
			what, overlap, agents.report())
	}
	if len(failures) > 0 {
		t.Errorf("%s: %d of %d calls failed (times UTC), first and last ones:\n%s\n%s", what, len(failures), calls,
			strings.Join(firstAndLast(failures, 5), "\n"), agents.report())
	}
	// Whether or not a call met the gap it opens: the DaemonSet stops the
	// old agent once the new pod is Ready.
	if early := agents.readyEarly(); len(early) > 0 {
		t.Errorf("%s: %s: the kubelet took another agent's answers for its probes\n%s", what, strings.Join(early, "; "), agents.report())
	}
}

// clock formats the times a rollout's report compares: the calls', the
// agent pods' changes and their log lines (UTC, as the logs' own).
const clock = "15:04:05.000"

// firstAndLast returns the first n and the last n of lines, or all.
func firstAndLast(lines []string, n int) []string {
	if len(lines) <= 2*n {
		return lines
	}
	return append(append(slices.Clip(lines[:n]), "..."), lines[len(lines)-n:]...)
}

// agentWatch follows the agent's pods during a rollout: each one's changes
// as the test sees them (created, sandbox made, initialized, running,
// Ready, deleted) and its agent
// container's log from its start, the kubelet's timestamp on each line.
type agentWatch struct {
	cancel context.CancelFunc
	watch  watch.Interface
	wg     sync.WaitGroup

	mu      sync.Mutex
	events  []string             // "time pod change", in order seen
	pods    map[string]*agentPod // by name
	order   []string             // names, in order seen
	overlap int                  // the most pods running at once, not terminating
}

// agentPod is what agentWatch keeps of one pod.
type agentPod struct {
	// The start's steps: the sandbox made (its network set up), the init
	// container done, the agent's container running.
	sandbox, initialized     bool
	running, ready, deleting bool
	readySince               time.Time // when the test first saw it Ready
	log                      strings.Builder
}

// watchAgents starts following the agent's pods, those running now
// included; stop ends it.
func watchAgents(t *testing.T, n *node.Node) *agentWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &agentWatch{cancel: cancel, pods: map[string]*agentPod{}}
	pods := n.Kube.CoreV1().Pods(agentNS)
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if w.watch, err = pods.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion}); err != nil {
		cancel()
		t.Fatal(err)
	}
	for i := range list.Items {
		w.seen(ctx, n, &list.Items[i])
	}
	w.wg.Go(func() {
		for ev := range w.watch.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				w.seen(ctx, n, p)
			}
		}
	})
	t.Cleanup(func() { w.stop() })
	return w
}

// seen records what changed in p since it was last seen, and follows the
// log of a pod it sees for the first time.
func (w *agentWatch) seen(ctx context.Context, n *node.Node, p *corev1.Pod) {
	now := time.Now().UTC().Format(clock)
	w.mu.Lock()
	defer w.mu.Unlock()
	a, ok := w.pods[p.Name]
	if !ok {
		a = &agentPod{}
		w.pods[p.Name] = a
		w.order = append(w.order, p.Name)
		w.events = append(w.events, fmt.Sprintf("%s %s seen (%s)", now, p.Name, p.Status.Phase))
		w.wg.Go(func() { w.follow(ctx, n, p.Name, a) })
	}
	change := func(have *bool, now bool, what string) {
		if *have != now {
			*have = now
			w.events = append(w.events, fmt.Sprintf("%s %s %s %v", time.Now().UTC().Format(clock), p.Name, what, now))
		}
	}
	change(&a.sandbox, podCondition(p, corev1.PodReadyToStartContainers), "sandbox")
	change(&a.initialized, podCondition(p, corev1.PodInitialized), "initialized")
	change(&a.running, p.Status.Phase == corev1.PodRunning, "running")
	if podReady(p) && a.readySince.IsZero() {
		a.readySince = time.Now()
	}
	change(&a.ready, podReady(p), "ready")
	change(&a.deleting, p.DeletionTimestamp != nil, "deleting")
	running := 0
	for _, a := range w.pods {
		if a.running && !a.deleting {
			running++
		}
	}
	w.overlap = max(w.overlap, running)
}

// follow copies the pod's agent log, from the container's start, until
// the pod is gone or the watch stops; it tries again while the container
// has not started (an error, or a log that ends empty at once).
func (w *agentWatch) follow(ctx context.Context, n *node.Node, name string, a *agentPod) {
	for {
		req := n.Kube.CoreV1().Pods(agentNS).GetLogs(name, &corev1.PodLogOptions{Container: "agent", Follow: true, Timestamps: true})
		stream, err := req.Stream(ctx)
		if err == nil {
			lines := w.copyLog(stream, a)
			stream.Close()
			if lines > 0 {
				return
			}
		}
		if errors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond): // until the container starts
		}
	}
}

// copyLog appends the stream's lines to a's log, each as it comes, and
// returns how many it read.
func (w *agentWatch) copyLog(stream io.Reader, a *agentPod) int {
	sc := bufio.NewScanner(stream)
	sc.Buffer(nil, 1<<20)
	lines := 0
	for ; sc.Scan(); lines++ {
		w.mu.Lock()
		a.log.WriteString(sc.Text() + "\n")
		w.mu.Unlock()
	}
	return lines
}

// stop ends the watch and the logs' streams and returns the most agent
// pods that ran at once. Calls after the first only return it.
func (w *agentWatch) stop() int {
	w.cancel()
	w.watch.Stop()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overlap
}

// readyEarly names the pods the test saw Ready before their agent listened
// on the health port (both as its log says): the agents of a rolling update
// share the port, and until the new one has taken it the old one answers
// there.
func (w *agentWatch) readyEarly() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var early []string
	for _, name := range w.order {
		a := w.pods[name]
		listened, ok := healthListened(a.log.String())
		if ok && !a.readySince.IsZero() && a.readySince.Before(listened) {
			early = append(early, fmt.Sprintf("%s Ready at %s, its agent listening on the health port at %s",
				name, a.readySince.UTC().Format(clock), listened.UTC().Format(clock)))
		}
	}
	return early
}

// healthListened returns when an agent's log (the kubelet's time, then the
// agent's JSON record, on each line) says it listened on the health port.
func healthListened(log string) (time.Time, bool) {
	for line := range strings.Lines(log) {
		if r, ok := parseRecord(line); ok && r.Msg == "listening" && r.Listener == "health" {
			return r.Time, true
		}
	}
	return time.Time{}, false
}

// milestones are the agent's records a rollout's timeline shows: where a
// node's seconds go, from the new agent's start to the old one's exit.
var milestones = []string{"starting", "listening", "agent ready", "shutting down", "stopped", "stopped while starting"}

// timeline is the pods' changes and, for each pod, when its agent logged
// each of the milestones (the health listener's "listening" only), in UTC.
func (w *agentWatch) timeline() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, e := range w.events {
		b.WriteString("  " + e + "\n")
	}
	for _, name := range w.order {
		fmt.Fprintf(&b, "  %s's agent:", name)
		for line := range strings.Lines(w.pods[name].log.String()) {
			if r, ok := parseRecord(line); ok && slices.Contains(milestones, r.Msg) && (r.Msg != "listening" || r.Listener == "health") {
				fmt.Fprintf(&b, " %s %s;", r.Time.UTC().Format(clock), r.Msg)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// record is what the rollout's reports read of an agent's JSON log record.
type record struct {
	Time     time.Time `json:"time"`
	Msg      string    `json:"msg"`
	Listener string    `json:"listener"`
}

// parseRecord reads a line of an agent pod's log: the kubelet's time, then
// the agent's JSON record.
func parseRecord(line string) (record, bool) {
	_, text, _ := strings.Cut(line, " ")
	var r record
	return r, json.Unmarshal([]byte(text), &r) == nil
}

// report is the pods' changes and their logs, for a failure.
// waitAgentsGone waits until the agent pods named before are deleted,
// w's report saying what the agents did if they are not.
func waitAgentsGone(t *testing.T, n *node.Node, before []string, w *agentWatch) {
	t.Helper()
	waitFor(t, time.Minute, "the old agent pods gone", func(ctx context.Context) error {
		for _, name := range before {
			_, err := n.Kube.CoreV1().Pods(agentNS).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				return fmt.Errorf("%s still there", name)
			}
			if !errors.IsNotFound(err) {
				return err
			}
		}
		return nil
	}, w.report)
}

func (w *agentWatch) report() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	b.WriteString("agent pods (UTC, as the test saw them):\n")
	for _, e := range w.events {
		b.WriteString("  " + e + "\n")
	}
	for _, name := range w.order {
		fmt.Fprintf(&b, "log of %s (the kubelet's time first):\n%s", name, w.pods[name].log.String())
	}
	return b.String()
}

// tlsAnswer checks that the backend answered 200 in TLS.
func tlsAnswer(res Result) error {
	rep, err := res.Report()
	switch {
	case err != nil:
		return err
	case res.Status != http.StatusOK:
		return fmt.Errorf("status %d", res.Status)
	}
	return wantTLS(rep)
}

// agentPods names the agent's pods.
func agentPods(t *testing.T, n *node.Node) []string {
	t.Helper()
	list, err := n.Kube.CoreV1().Pods(agentNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Name)
	}
	return names
}
