package health

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

func TestReadyz(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	snapshotErr := errors.New("no snapshot applied yet")
	c.Add("datapath", func() error { return nil })
	c.Add("snapshot", func() error { return snapshotErr })
	h := c.Handler()

	code, body := get(t, h, "/readyz")
	if want := "[+]datapath ok\n[-]snapshot failed: no snapshot applied yet\nnot ready\n"; code != http.StatusServiceUnavailable || body != want {
		t.Errorf("/readyz with a failing check = %d %q, want 503 %q", code, body, want)
	}
	if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d while not ready, want 200: liveness is not readiness", code)
	}
	if err := c.Ready(); err == nil || err.Error() != "snapshot: no snapshot applied yet" {
		t.Errorf("Ready() = %v, want the failing check named", err)
	}
	if v := gauge(t, reg); v != 0 {
		t.Errorf("sockmesh_agent_ready = %v while not ready, want 0", v)
	}

	snapshotErr = nil
	if code, body := get(t, h, "/readyz"); code != http.StatusOK || body != "[+]datapath ok\n[+]snapshot ok\nok\n" {
		t.Errorf("/readyz with passing checks = %d %q, want 200", code, body)
	}
	if v := gauge(t, reg); v != 1 {
		t.Errorf("sockmesh_agent_ready = %v when ready, want 1", v)
	}
	if code, _ := get(t, h, "/other"); code != http.StatusNotFound {
		t.Errorf("/other = %d, want 404", code)
	}
}

func gauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sockmesh_agent_ready" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("sockmesh_agent_ready not registered")
	return 0
}
