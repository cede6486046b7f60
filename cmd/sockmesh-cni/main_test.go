package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/sockmesh/sockmesh/agent/cnihandover"
	"github.com/sockmesh/sockmesh/agent/cniwire"
	"github.com/sockmesh/sockmesh/internal/sandbox"
)

// envPlugin makes the test binary the plugin: the tests run it as the
// runtime runs a CNI plugin (environment, configuration on stdin, result
// on stdout).
const envPlugin = "SOCKMESH_CNI_TEST_AS_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(envPlugin) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// agent is the agent's side of the handover behind a real socket server.
type agent struct {
	mu     sync.Mutex
	got    []cniwire.Pod
	inodes []uint64 // of the namespaces that came with them
	answer cniwire.Answer
	err    error
}

func (a *agent) Enrol(_ context.Context, p cniwire.Pod, netns *os.File) (cniwire.Answer, error) {
	defer netns.Close()
	fi, err := netns.Stat()
	if err != nil {
		return cniwire.Answer{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got, a.inodes = append(a.got, p), append(a.inodes, fi.Sys().(*syscall.Stat_t).Ino)
	return a.answer, a.err
}

func (a *agent) handovers() []cniwire.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]cniwire.Pod(nil), a.got...)
}

// serveAgent serves a on a socket until t ends and returns its path.
func serveAgent(t *testing.T, a *agent) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cni.sock")
	ln, err := cnihandover.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cnihandover.NewServer(cnihandover.Config{}, a, slog.New(slog.NewTextHandler(t.Output(), nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return path
}

// prevResult is the bridge plugin's result, as the runtime passes it on:
// its bytes must come out of ADD as they went in.
const prevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/cni-1"}],` +
	`"ips":[{"interface":0,"address":"10.244.0.5/24","gateway":"10.244.0.1"},{"interface":0,"address":"fd00:244::5/64"}],` +
	`"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}`

func config(socket string, extra string) string {
	return `{"cniVersion":"1.0.0","name":"smnet","type":"sockmesh-cni","socket":"` + socket + `"` + extra +
		`,"prevResult":` + prevResult + `}`
}

const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=app;K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID=a-uid"

type run struct {
	stdout, stderr string
	err            error
}

// podNetNS makes the pod's network namespace (the runtime's plugins check
// that it is not theirs) and returns its path.
func podNetNS(t *testing.T) string {
	t.Helper()
	return sandbox.NewNetNS(t).Path()
}

// invoke runs the plugin as a runtime does, for a pod in the namespace at
// netnsPath.
func invoke(t *testing.T, command, netnsPath, args, stdin string) run {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0])
	cmd.Env = append(os.Environ(), envPlugin+"=1", "CNI_COMMAND="+command, "CNI_CONTAINERID=c0ffee",
		"CNI_NETNS="+netnsPath, "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin", "CNI_ARGS="+args)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return run{stdout.String(), stderr.String(), err}
}

// cniError reads the error a plugin prints on failure.
func cniError(t *testing.T, r run) string {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(r.err, &ee) {
		t.Fatalf("plugin run: %v, stdout %q; want it to fail", r.err, r.stdout)
	}
	var e struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || e.Msg == "" {
		t.Fatalf("plugin failed without a CNI error on stdout: %q (%v)", r.stdout, err)
	}
	return e.Msg
}

func TestAddCaptured(t *testing.T) {
	a := &agent{answer: cniwire.Answer{Captured: true}}
	socket := serveAgent(t, a)
	netnsPath := podNetNS(t)
	r := invoke(t, "ADD", netnsPath, podArgs, config(socket, ""))
	if r.err != nil {
		t.Fatalf("ADD: %v\nstdout %s\nstderr %s", r.err, r.stdout, r.stderr)
	}
	if r.stdout != prevResult {
		t.Errorf("ADD printed\n%s\nwant the previous result untouched\n%s", r.stdout, prevResult)
	}
	want := []cniwire.Pod{{Namespace: "app", Name: "a", UID: "a-uid", ContainerID: "c0ffee", NetNS: netnsPath,
		IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("fd00:244::5")}}}
	if got := a.handovers(); !reflect.DeepEqual(got, want) {
		t.Errorf("the agent got %+v, want %+v", got, want)
	}
	fi, err := os.Stat(netnsPath)
	if err != nil {
		t.Fatal(err)
	}
	if ino := fi.Sys().(*syscall.Stat_t).Ino; !reflect.DeepEqual(a.inodes, []uint64{ino}) {
		t.Errorf("the agent got namespaces of inodes %v, want the pod's, %d", a.inodes, ino)
	}
}

// TestAddFailsClosed: when the agent cannot enrol the pod, or no agent
// answers, ADD fails (the kubelet makes the sandbox again later), but for
// pods of an exempt namespace.
func TestAddFailsClosed(t *testing.T) {
	failing := serveAgent(t, &agent{err: errors.New("the enrolment map's last write failed")})
	none := filepath.Join(t.TempDir(), "absent.sock")
	netnsPath := podNetNS(t)
	for _, tc := range []struct {
		name, socket, extra, errHas string
	}{
		{"the agent failed", failing, "", "the enrolment map's last write failed"},
		{"no agent", none, "", "no sockmesh agent serves the CNI socket"},
		{"no agent, another namespace exempt", none, `,"exemptNamespaces":["kube-system"]`, "no sockmesh agent"},
		{"no agent, exempt", none, `,"exemptNamespaces":["kube-system","app"]`, ""},
		{"the agent failed, exempt", failing, `,"exemptNamespaces":["app"]`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := invoke(t, "ADD", netnsPath, podArgs, config(tc.socket, tc.extra))
			if tc.errHas != "" {
				if msg := cniError(t, r); !strings.Contains(msg, tc.errHas) {
					t.Errorf("ADD failed with %q, want it to say %q", msg, tc.errHas)
				}
				return
			}
			if r.err != nil || r.stdout != prevResult {
				t.Errorf("ADD = %v, stdout %q; want the previous result", r.err, r.stdout)
			}
			if !strings.Contains(r.stderr, "starts uncaptured") {
				t.Errorf("stderr %q, want a note that the pod starts uncaptured", r.stderr)
			}
		})
	}
}

func TestAddErrors(t *testing.T) {
	socket := serveAgent(t, &agent{answer: cniwire.Answer{Captured: true}})
	netnsPath := podNetNS(t)
	for _, tc := range []struct{ name, stdin, errHas string }{
		{"not chained", `{"cniVersion":"1.0.0","name":"smnet","type":"sockmesh-cni","socket":"` + socket + `"}`, "must be chained after"},
		{"bad timeout", config(socket, `,"timeout":"soon"`), `timeout "soon"`},
		{"bad previous result", strings.Replace(config(socket, ""), "10.244.0.5/24", "10.244.0.5", 1), "previous result"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if msg := cniError(t, invoke(t, "ADD", netnsPath, podArgs, tc.stdin)); !strings.Contains(msg, tc.errHas) {
				t.Errorf("ADD failed with %q, want it to say %q", msg, tc.errHas)
			}
		})
	}
}

// TestNotAPod: a container of no Kubernetes pod has nothing to hand over.
func TestNotAPod(t *testing.T) {
	none := filepath.Join(t.TempDir(), "absent.sock")
	r := invoke(t, "ADD", podNetNS(t), "IgnoreUnknown=1", config(none, ""))
	if r.err != nil || r.stdout != prevResult {
		t.Errorf("ADD without K8S_POD_NAME = %v, stdout %q; want the previous result", r.err, r.stdout)
	}
}

// TestDelCheckVersion: DEL removes the sandbox's handover record (and
// only its), and succeeds without one; neither it nor CHECK hands over.
func TestDelCheckVersion(t *testing.T) {
	a := &agent{}
	socket := serveAgent(t, a)
	netnsPath := podNetNS(t)
	records := cniwire.RecordDir(socket)
	if err := os.MkdirAll(records, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"c0ffee.json", "other.json"} {
		if err := os.WriteFile(filepath.Join(records, name), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, cmd := range []string{"DEL", "DEL", "CHECK"} {
		if r := invoke(t, cmd, netnsPath, podArgs, config(socket, "")); r.err != nil || r.stdout != "" {
			t.Errorf("%s = %v, stdout %q; want success, nothing printed", cmd, r.err, r.stdout)
		}
	}
	if got := a.handovers(); len(got) != 0 {
		t.Errorf("DEL and CHECK handed over %+v, want nothing", got)
	}
	if left, _ := filepath.Glob(filepath.Join(records, "*")); !reflect.DeepEqual(left, []string{filepath.Join(records, "other.json")}) {
		t.Errorf("records after DEL of sandbox c0ffee = %v, want other.json alone", left)
	}
	r := invoke(t, "VERSION", "", "", `{"cniVersion":"1.0.0"}`)
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); r.err != nil || err != nil || !reflect.DeepEqual(v.Supported, []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}) {
		t.Errorf("VERSION = %v, %q", r.err, r.stdout)
	}
}
