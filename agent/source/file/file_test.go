package file

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/source"
	"github.com/sockmesh/sockmesh/agent/translate"
)

var _ source.Source = (*Source)(nil)

func service(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: apps}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: grpc, port: 9000, appProtocol: kubernetes.io/h2c}]
`, name)
}

func configMap(names ...string) string {
	var docs []string
	for _, n := range names {
		docs = append(docs, fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s, namespace: apps}\ndata: {ca.crt: x}\n", n))
	}
	return strings.Join(docs, "---\n")
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	// Write and rename, as kubectl cp or an editor's safe save would, so a
	// concurrent reader never sees half a file.
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func newSource(t *testing.T, dir string) *Source {
	t.Helper()
	s, err := New(Config{Dir: dir, Debounce: 100 * time.Millisecond, Resync: time.Hour},
		slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// signalled reports whether Changed holds a signal, consuming it.
func signalled(s *Source) bool {
	select {
	case <-s.Changed():
		return true
	default:
		return false
	}
}

func names[T interface{ GetName() string }](objs []T) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetName())
	}
	slices.Sort(out)
	return out
}

func counter(t *testing.T, s *Source, result string) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.reloads.WithLabelValues(result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestNewRequiresDir(t *testing.T) {
	if _, err := New(Config{}, slog.Default(), nil); err == nil {
		t.Fatal("New(Config{}) = nil error, want one naming Dir")
	}
}

func TestReloadKeepsLastGoodFile(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", service("a"))
	write(t, dir, "b.yaml", configMap("ca-1"))
	s := newSource(t, dir)

	s.reload()
	if !signalled(s) {
		t.Fatal("first reload did not signal Changed")
	}
	if got := names(s.Input().Services); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Services = %v, want [a]", got)
	}

	// a.yaml breaks while b.yaml gains an object: a's last good Service
	// stays, b's change is taken, the error names a.yaml and the reason.
	write(t, dir, "a.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: a2}\nspec: {portz: 1}\n")
	write(t, dir, "b.yaml", configMap("ca-1", "ca-2"))
	s.reload()
	if !signalled(s) {
		t.Fatal("reload after b.yaml changed did not signal")
	}
	in := s.Input()
	if got := names(in.Services); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Services = %v, want the last good [a]", got)
	}
	if got := names(in.ConfigMaps); !slices.Equal(got, []string{"ca-1", "ca-2"}) {
		t.Errorf("ConfigMaps = %v, want [ca-1 ca-2]", got)
	}
	errs := s.Errors()
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "a.yaml") || !strings.Contains(errs[0].Error(), `unknown field "spec.portz"`) {
		t.Fatalf("Errors() = %v, want one naming a.yaml and the unknown field", errs)
	}
	if got := counter(t, s, "error"); got != 1 {
		t.Errorf("reloads{result=error} = %v, want 1", got)
	}

	// Fixed: the new content replaces the old, the error goes.
	write(t, dir, "a.yaml", service("a2"))
	s.reload()
	if !signalled(s) {
		t.Fatal("reload after the fix did not signal")
	}
	if got := names(s.Input().Services); !slices.Equal(got, []string{"a2"}) {
		t.Errorf("Services = %v, want [a2]", got)
	}
	if errs := s.Errors(); len(errs) != 0 {
		t.Errorf("Errors() = %v after the fix, want none", errs)
	}
}

// TestReloadRefusesWhatTheCRDRefuses: a file whose new content holds an
// object its CRD refuses (here the HTTPRoute CRD's 16 hostnames) is not
// used, its other objects neither: its last good content stays whole, and
// the error names the file, the document, the object and the field.
func TestReloadRefusesWhatTheCRDRefuses(t *testing.T) {
	dir := t.TempDir()
	route := func(hostnames int) string {
		h := make([]string, hostnames)
		for i := range h {
			h[i] = fmt.Sprintf("h%d.example.com", i)
		}
		return "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: apps}\n" +
			`spec: {parentRefs: [{group: "", kind: Service, name: a, port: 9000}], hostnames: [` + strings.Join(h, ", ") + "]}\n"
	}
	write(t, dir, "a.yaml", service("a")+"---\n"+route(16))
	s := newSource(t, dir)
	s.reload()
	if errs := s.Errors(); len(errs) != 0 {
		t.Fatalf("Errors() = %v, want none", errs)
	}

	write(t, dir, "a.yaml", service("a2")+"---\n"+route(17))
	s.reload()
	in := s.Input()
	if got := names(in.Services); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Services = %v, want the last good [a]", got)
	}
	if len(in.HTTPRoutes) != 1 || len(in.HTTPRoutes[0].Spec.Hostnames) != 16 {
		t.Errorf("HTTPRoutes = %d, want the last good one, of 16 hostnames", len(in.HTTPRoutes))
	}
	const want = "a.yaml: document 2: HTTPRoute apps/r: spec.hostnames: Too many: 17: must have at most 16 items"
	if errs := s.Errors(); len(errs) != 1 || !strings.Contains(errs[0].Error(), want) {
		t.Errorf("Errors() = %v, want one saying %q", errs, want)
	}
}

// TestReloadWarnsOfDeprecatedVersions: an object written in a version its
// CRD deprecates (BackendTLSPolicy v1alpha3) is served, and logged once,
// naming the file, the object, its version and the one to use, as
// kubectl apply prints the API server's warning — not again when the
// directory is read again, nor when its file is decoded again for another
// change; again once it came back after it was written as v1.
func TestReloadWarnsOfDeprecatedVersions(t *testing.T) {
	dir := t.TempDir()
	policy := func(version string) string {
		return "apiVersion: gateway.networking.k8s.io/" + version + "\nkind: BackendTLSPolicy\nmetadata: {name: t, namespace: apps}\n" +
			`spec: {targetRefs: [{group: "", kind: Service, name: a}], validation: {hostname: a.example.com, wellKnownCACertificates: System}}` + "\n"
	}
	write(t, dir, "a.yaml", service("a")+"---\n"+policy("v1alpha3"))
	var logs bytes.Buffer
	s, err := New(Config{Dir: dir, Resync: time.Hour}, slog.New(slog.NewJSONHandler(&logs, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	warnings := func() []map[string]any {
		var out []map[string]any
		for line := range strings.Lines(logs.String()) {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			if rec["msg"] == "object in a deprecated api version" {
				out = append(out, rec)
			}
		}
		return out
	}
	s.reload()
	if got := s.Input().BackendTLSPolicies; len(got) != 1 || got[0].APIVersion != "gateway.networking.k8s.io/v1" {
		t.Fatalf("BackendTLSPolicies = %v, want the policy, as v1", got)
	}
	w := warnings()
	if len(w) != 1 {
		t.Fatalf("deprecation warnings after the first read = %d, want 1; log:\n%s", len(w), logs.String())
	}
	for k, want := range map[string]string{"file": filepath.Join(dir, "a.yaml"), "object": "BackendTLSPolicy apps/t",
		"api_version": "gateway.networking.k8s.io/v1alpha3", "use": "gateway.networking.k8s.io/v1", "level": "WARN"} {
		if w[0][k] != want {
			t.Errorf("warning's %s = %v, want %q", k, w[0][k], want)
		}
	}
	if text, _ := w[0]["warning"].(string); !strings.Contains(text, "deprecated") {
		t.Errorf("warning's text = %q, want the CRD's, saying deprecated", text)
	}

	s.reload()                                                        // a resync
	write(t, dir, "a.yaml", service("a2")+"---\n"+policy("v1alpha3")) // decoded again
	s.reload()
	if got := names(s.Input().Services); !slices.Equal(got, []string{"a2"}) {
		t.Fatalf("Services = %v, want [a2]: the file was not read again", got)
	}
	if n := len(warnings()); n != 1 {
		t.Errorf("deprecation warnings after a resync and a change = %d, want still 1", n)
	}

	write(t, dir, "a.yaml", service("a2")+"---\n"+policy("v1"))
	s.reload()
	write(t, dir, "a.yaml", service("a2")+"---\n"+policy("v1alpha3"))
	s.reload()
	if n := len(warnings()); n != 2 {
		t.Errorf("deprecation warnings once written as v1 and back = %d, want 2", n)
	}
}

// TestReloadRefusesLargeFiles: a file over maxFileBytes (a log or a dump
// put there by mistake) is refused before it is read whole; its last good
// content stays, and once it is put back as it was the error goes. A file
// of maxFileBytes is read (comments only: nothing to decode).
func TestReloadRefusesLargeFiles(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", service("a"))
	comments := func(n int) string {
		line := "# " + strings.Repeat("x", 1021) + "\n"
		return strings.Repeat(line, n/len(line)) + strings.Repeat("#", n%len(line))
	}
	write(t, dir, "b.yaml", comments(maxFileBytes))
	s := newSource(t, dir)
	s.reload()
	if errs := s.Errors(); len(errs) != 0 {
		t.Fatalf("Errors() = %v, want none (a file of maxFileBytes is read)", errs)
	}

	write(t, dir, "a.yaml", comments(maxFileBytes+1))
	s.reload()
	if got := names(s.Input().Services); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Services = %v, want the last good [a]", got)
	}
	want := fmt.Sprintf("a.yaml: over %d bytes: not read", maxFileBytes)
	if errs := s.Errors(); len(errs) != 1 || !strings.Contains(errs[0].Error(), want) {
		t.Fatalf("Errors() = %v, want one saying %q", errs, want)
	}

	write(t, dir, "a.yaml", service("a"))
	s.reload()
	if errs := s.Errors(); len(errs) != 0 {
		t.Errorf("Errors() = %v after a.yaml got its last good bytes back, want none", errs)
	}
}

// TestReloadKeepsFileBehindBrokenLink: a file that becomes a link that
// cannot be followed (here a loop) is an error that keeps its last good
// content, not a removal; a dangling link is no file.
func TestReloadKeepsFileBehindBrokenLink(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", service("a"))
	s := newSource(t, dir)
	s.reload()
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.yaml", filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	s.reload()
	if got := names(s.Input().Services); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Services = %v, want the last good [a]", got)
	}
	if errs := s.Errors(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "a.yaml: stat") || !strings.Contains(errs[0].Error(), "too many levels of symbolic links") {
		t.Errorf("Errors() = %v, want a.yaml's link loop", errs)
	}

	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("missing.yaml", filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	s.reload()
	if got := names(s.Input().Services); len(got) != 0 {
		t.Errorf("Services = %v behind a dangling link, want none", got)
	}
	if errs := s.Errors(); len(errs) != 0 {
		t.Errorf("Errors() = %v, want none", errs)
	}
}

// TestReloadHoldsEmptiedFile: a file emptied in place, as a shell's
// "> file" does before its writer writes, keeps its objects (and says so)
// until its new content comes, or until it has stayed empty for Resync.
func TestReloadHoldsEmptiedFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, "a.yaml", service("a"))
		s := newSource(t, dir)
		s.reload()
		signalled(s)

		empty := func() {
			if err := os.WriteFile(filepath.Join(dir, "a.yaml"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		empty()
		s.reload()
		if got := names(s.Input().Services); !slices.Equal(got, []string{"a"}) || signalled(s) {
			t.Errorf("Services = %v just after a.yaml was emptied, want [a] kept", got)
		}
		if errs := s.Errors(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "a.yaml: emptied: its objects stay until it has been empty for 1h0m0s") {
			t.Errorf("Errors() = %v, want a.yaml emptied", errs)
		}
		// Its writer writes: the new content is taken.
		time.Sleep(30 * time.Minute)
		write(t, dir, "a.yaml", service("b"))
		s.reload()
		if got := names(s.Input().Services); !slices.Equal(got, []string{"b"}) || len(s.Errors()) != 0 {
			t.Errorf("Services = %v, errors %v once a.yaml is written, want [b] and none", got, s.Errors())
		}

		// Emptied for good: taken once it stayed empty for Resync.
		empty()
		s.reload()
		time.Sleep(59 * time.Minute)
		s.reload()
		if got := names(s.Input().Services); !slices.Equal(got, []string{"b"}) {
			t.Errorf("Services = %v a.yaml empty for 59m, want [b] kept", got)
		}
		time.Sleep(time.Minute)
		s.reload()
		if got := names(s.Input().Services); len(got) != 0 || len(s.Errors()) != 0 {
			t.Errorf("Services = %v, errors %v once a.yaml was empty for Resync, want none", got, s.Errors())
		}
	})
}

func TestReloadSignalsOnlyChanges(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", service("a"))
	s := newSource(t, dir)
	s.reload()
	if !signalled(s) {
		t.Fatal("first reload did not signal")
	}
	for _, step := range []struct {
		name   string
		change func()
		want   bool
	}{
		{"nothing", func() {}, false},
		{"same bytes rewritten", func() { write(t, dir, "a.yaml", service("a")) }, false},
		{"a broken edit (objects unchanged)", func() { write(t, dir, "a.yaml", "kind: [") }, false},
		{"a new file", func() { write(t, dir, "b.yaml", configMap("x")) }, true},
		{"a file removed", func() { os.Remove(filepath.Join(dir, "b.yaml")) }, true},
		{"a file that never parsed", func() { write(t, dir, "c.yaml", "{{{") }, false},
	} {
		step.change()
		s.reload()
		if got := signalled(s); got != step.want {
			t.Errorf("after %s: Changed signalled %v, want %v", step.name, got, step.want)
		}
	}
	if got := names(s.Input().Services); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Services = %v, want [a]", got)
	}
	if got := len(s.Errors()); got != 2 {
		t.Errorf("Errors() has %d entries, want 2 (a.yaml, c.yaml): %v", got, s.Errors())
	}
}

func TestReloadReadsOnlyManifests(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", service("a"))
	write(t, dir, "b.yml", service("b"))
	write(t, dir, "c.json", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"c","namespace":"apps"}}`)
	write(t, dir, "notes.txt", "not a manifest")
	write(t, dir, ".hidden.yaml", service("hidden"))
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "sub.yaml"), "d.yaml", service("d"))
	if err := os.Symlink("missing.yaml", filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	s := newSource(t, dir)
	s.reload()
	if got := names(s.Input().Services); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("Services = %v, want [a b c]", got)
	}
	if errs := s.Errors(); len(errs) != 0 {
		t.Errorf("Errors() = %v, want none", errs)
	}
}

func TestReloadReportsDuplicates(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", configMap("ca"))
	write(t, dir, "b.yaml", configMap("ca", "other"))
	s := newSource(t, dir)
	s.reload()
	if got := names(s.Input().ConfigMaps); !slices.Equal(got, []string{"ca", "other"}) {
		t.Errorf("ConfigMaps = %v, want [ca other]", got)
	}
	errs := s.Errors()
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "b.yaml: ConfigMap apps/ca is already defined in a.yaml") {
		t.Errorf("Errors() = %v, want the duplicate in b.yaml reported", errs)
	}
}

// TestLoopDebounces checks that a burst of events makes one reload,
// Debounce after its first event, and nothing before.
func TestLoopDebounces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, "a.yaml", service("a"))
		s := newSource(t, dir)
		events := make(chan struct{}, 1)
		stop := runLoop(t, s, events, nil)
		defer stop()

		synctest.Wait()
		if !signalled(s) {
			t.Fatal("no signal after the initial read")
		}
		write(t, dir, "b.yaml", service("b"))
		events <- struct{}{}
		time.Sleep(60 * time.Millisecond)
		write(t, dir, "c.yaml", service("c"))
		events <- struct{}{}
		synctest.Wait()
		if signalled(s) {
			t.Fatal("reloaded before Debounce had passed since the burst began")
		}
		time.Sleep(40 * time.Millisecond)
		synctest.Wait()
		if !signalled(s) {
			t.Fatal("no reload Debounce after the burst began")
		}
		if got := names(s.Input().Services); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Errorf("Services = %v, want [a b c]", got)
		}
		if got := counter(t, s, "ok"); got != 2 {
			t.Errorf("reloads = %v, want 2 (initial, and one for the burst)", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if signalled(s) || counter(t, s, "ok") != 2 {
			t.Error("reloaded again without events")
		}
	})
}

// TestLoopResyncRecoversDirectory checks that the periodic resync keeps the
// last good objects while the directory is gone and picks up its new
// content once it is back.
func TestLoopResyncRecoversDirectory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "manifests")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, dir, "a.yaml", service("a"))
		s := newSource(t, dir)
		rewatched := 0
		stop := runLoop(t, s, nil, func() { rewatched++ })
		defer stop()
		synctest.Wait()
		signalled(s)

		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if signalled(s) {
			t.Error("signalled while the directory is gone")
		}
		if got := names(s.Input().Services); !slices.Equal(got, []string{"a"}) {
			t.Errorf("Services = %v while the directory is gone, want the last good [a]", got)
		}
		if errs := s.Errors(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "read directory") {
			t.Errorf("Errors() = %v, want the directory read error", errs)
		}

		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, dir, "b.yaml", service("b"))
		time.Sleep(time.Hour)
		synctest.Wait()
		if !signalled(s) {
			t.Fatal("no signal once the directory is back")
		}
		if got := names(s.Input().Services); !slices.Equal(got, []string{"b"}) {
			t.Errorf("Services = %v, want [b]", got)
		}
		if rewatched != 2 {
			t.Errorf("rewatch called %d times, want once per resync (2)", rewatched)
		}
	})
}

func runLoop(t *testing.T, s *Source, events chan struct{}, rewatch func()) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.loop(ctx, events, rewatch) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("loop: %v", err)
		}
	}
}

// waitChanged waits for a signal; the deadline only turns a hang into a
// failure.
func waitChanged(t *testing.T, s *Source, what string) translate.Input {
	t.Helper()
	select {
	case <-s.Changed():
		return s.Input()
	case <-time.After(30 * time.Second):
		t.Fatalf("no Changed signal after %s", what)
		return translate.Input{}
	}
}

// TestRunWatchesDirectory runs the real fsnotify watcher on a directory
// laid out like a mounted ConfigMap (files are links into ..data, which is
// swapped atomically on update).
func TestRunWatchesDirectory(t *testing.T) {
	dir := t.TempDir()
	mkVersion := func(version string, files map[string]string) {
		vdir := filepath.Join(dir, version)
		if err := os.Mkdir(vdir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(vdir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// ln -sfn version ..data, atomically.
		if err := os.Symlink(version, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	mkVersion("..v1", map[string]string{"services.yaml": service("a")})
	if err := os.Symlink(filepath.Join("..data", "services.yaml"), filepath.Join(dir, "services.yaml")); err != nil {
		t.Fatal(err)
	}

	s := newSource(t, dir)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	if got := names(waitChanged(t, s, "start").Services); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Services = %v, want [a]", got)
	}
	write(t, dir, "more.yaml", configMap("ca"))
	if got := names(waitChanged(t, s, "writing more.yaml").ConfigMaps); !slices.Equal(got, []string{"ca"}) {
		t.Fatalf("ConfigMaps = %v, want [ca]", got)
	}
	mkVersion("..v2", map[string]string{"services.yaml": service("b")})
	if got := names(waitChanged(t, s, "swapping ..data").Services); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Services = %v after the ConfigMap update, want [b]", got)
	}
}

func TestRunFailsWithoutDirectory(t *testing.T) {
	s := newSource(t, filepath.Join(t.TempDir(), "missing"))
	if err := s.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Run on a missing directory = %v, want an error naming it", err)
	}
}

// TestClipCapsEveryList fills every list of a translate.Input with spare
// capacity: clip must cap each one, so that a caller appending to the Input
// it was handed never writes into an array the source shares. Walking the
// fields keeps a kind added to Input later from being missed.
func TestClipCapsEveryList(t *testing.T) {
	var in translate.Input
	v := reflect.ValueOf(&in).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Slice {
			f.Set(reflect.MakeSlice(f.Type(), 1, 4))
		}
	}
	clip(&in)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Slice && f.Cap() != f.Len() {
			t.Errorf("after clip, Input.%s has len %d, cap %d; want cap = len", v.Type().Field(i).Name, f.Len(), f.Cap())
		}
	}
}
