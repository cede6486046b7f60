package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/translate"
)

var (
	services   = schema.GroupResource{Resource: "services"}
	httpRoutes = schema.GroupResource{Group: "gateway.networking.k8s.io", Resource: "httproutes"}
)

// quotaFull is what a namespace whose Service quota is used up answers
// selectorsvc's create, as selectorsvc wraps it.
func quotaFull(namespace string) error {
	return fmt.Errorf("create service for xbackend %s/pods: %w", namespace, apierrors.NewForbidden(services, "",
		errors.New("exceeded quota: q, requested: services=1, used: services=0, limited: services=0")))
}

// webhookDown is what the API server answers a status patch when a
// validating webhook (failurePolicy Fail) cannot be called.
func webhookDown(name string) error {
	return fmt.Errorf("write status of HTTPRoute ns/%s: %w", name, apierrors.NewInternalError(
		errors.New(`failed calling webhook "check.example.com": failed to call webhook: Post "https://127.0.0.1:1/": dial tcp 127.0.0.1:1: connect: connection refused`)))
}

func invalidStatus(name string) error {
	return fmt.Errorf("write status of HTTPRoute ns/%s: %w", name, apierrors.NewInvalid(
		schema.GroupKind{Group: httpRoutes.Group, Kind: "HTTPRoute"}, name,
		field.ErrorList{field.TooLong(field.NewPath("status", "parents"), "", 32)}))
}

// TestRefusedWriteHoldsNothingBack: a writer whose objects the API server
// refuses for good (a full quota, a status it finds invalid) on every
// write is not retried on a timer, and the other writer gets each new
// translation at once; before, the whole pass was retried with backoff up
// to a minute, and nothing newer was written meanwhile.
func TestRefusedWriteHoldsNothingBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
		refused := &flakyWriter{fail: 1 << 30, err: errors.Join(quotaFull("tenant"), invalidStatus("r"))}
		healthy := &flakyWriter{}
		events := &logged{}
		c, err := New(Config{Writers: []Writer{refused, healthy}, RetryInterval: time.Second, Resync: noResync}, src,
			slog.New(events), nil)
		if err != nil {
			t.Fatal(err)
		}
		run(t, c)
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if r, h := refused.count(), healthy.count(); r != 1 || h != 1 {
			t.Fatalf("writes of one translation in 10 min: %d refused, %d healthy; want 1 and 1", r, h)
		}

		src.set(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10"), h2cService("b", "10.96.0.11")}})
		synctest.Wait() // no time passes
		if r, h := refused.count(), healthy.count(); r != 2 || h != 2 || len(healthy.last.Frontends) != 2 {
			t.Fatalf("at once after a new translation: %d refused, %d healthy writes (the last with %d frontends); want 2, 2 (2)",
				r, h, len(healthy.last.Frontends))
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if r, h := refused.count(), healthy.count(); r != 2 || h != 2 {
			t.Errorf("writes 10 min later: %d refused, %d healthy; want still 2 and 2", r, h)
		}

		for reason, want := range map[string]float64{"forbidden": 2, "invalid": 2} {
			if got := count(t, c.m.writeRefusals.WithLabelValues(reason)); got != want {
				t.Errorf("write_refusals_total{reason=%q} = %v, want %v", reason, got, want)
			}
		}
		if got := count(t, c.m.writeErrors.WithLabelValues("all")); got != 0 {
			t.Errorf("write_errors_total = %v, want 0 (nothing to retry)", got)
		}
		warned := map[string]int{}
		got := events.recent()
		for _, e := range got {
			if e.Message == "write refused; tried again at the next translation" {
				warned[e.Attrs["reason"]]++
				if !strings.Contains(e.Attrs["err"], "tenant/pods") && !strings.Contains(e.Attrs["err"], "HTTPRoute ns/r") {
					t.Errorf("the warning does not name the object: %q", e.Attrs["err"])
				}
			}
		}
		if warned["forbidden"] != 2 || warned["invalid"] != 2 {
			t.Errorf("refusal warnings by reason = %v, want forbidden and invalid twice each", warned)
		}
	})
}

// TestWriteErrorClasses: a write error is retried with backoff unless each
// error it joins is a refusal of one object; one that may clear beside
// refusals is retried (errors.As on the join would match the refusal). One
// about its object alone (a 500 such as an admission webhook the API server
// could not call, a conflict) is retried alone (scope object), the others
// back every write off (scope all).
func TestWriteErrorClasses(t *testing.T) {
	webhookDenial := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 400,
		Message: `admission webhook "policy.example.com" denied the request: no`}}
	unavailable := apierrors.NewServiceUnavailable("etcd leader changed")
	conflict := apierrors.NewConflict(httpRoutes, "r", errors.New("the object has been modified"))
	for _, tc := range []struct {
		name  string
		err   error
		scope string // of the retry; "" for none
	}{
		{"quota full", quotaFull("tenant"), ""},
		{"rbac", apierrors.NewForbidden(httpRoutes, "r", errors.New(`cannot patch resource "httproutes/status"`)), ""},
		{"invalid", invalidStatus("r"), ""},
		{"webhook denial", webhookDenial, ""},
		{"too large", apierrors.NewRequestEntityTooLargeError("limit is 3145728"), ""},
		{"method not allowed", apierrors.NewMethodNotSupported(services, "patch"), ""},
		{"namespace gone", apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "tenant"), ""},
		{"refusals joined", errors.Join(quotaFull("a"), invalidStatus("r"), webhookDenial), ""},
		{"refusals joined and wrapped", fmt.Errorf("write: %w", errors.Join(quotaFull("a"), invalidStatus("r"))), ""},
		{"conflict", conflict, "object"},
		{"webhook unreachable", webhookDown("r"), "object"},
		{"conflicts joined", errors.Join(conflict, webhookDown("r")), "object"},
		{"throttled", apierrors.NewTooManyRequests("slow down", 1), "all"},
		{"unavailable", unavailable, "all"},
		{"server timeout", apierrors.NewServerTimeout(services, "create", 1), "all"},
		{"deadline", fmt.Errorf("patch: %w", context.DeadlineExceeded), "all"},
		{"network", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, "all"},
		{"refusal beside an outage", errors.Join(quotaFull("a"), unavailable), "all"},
		{"refusal beside an outage, both wrapped", fmt.Errorf("%w; %w", invalidStatus("r"), unavailable), "all"},
		{"refusal beside an outage, nested", errors.Join(quotaFull("a"), fmt.Errorf("status: %w", errors.Join(invalidStatus("r"), unavailable))), "all"},
		{"webhook unreachable beside an outage", errors.Join(webhookDown("r"), unavailable), "all"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := newMemSource(translate.Input{Services: []*corev1.Service{h2cService("a", "10.96.0.10")}})
				w := &flakyWriter{fail: 1, err: tc.err}
				c, err := New(Config{Writers: []Writer{w}, RetryInterval: time.Second}, src, slog.New(slog.DiscardHandler), nil)
				if err != nil {
					t.Fatal(err)
				}
				run(t, c)
				time.Sleep(time.Minute)
				synctest.Wait()
				retried := tc.scope != ""
				if got := w.count() > 1; got != retried || Retryable(tc.err) != retried {
					t.Errorf("writes in a minute = %d, Retryable = %v; want retried %v", w.count(), Retryable(tc.err), retried)
				}
				for _, scope := range []string{"object", "all"} {
					want := 0.0
					if scope == tc.scope {
						want = 1
					}
					if got := count(t, c.m.writeErrors.WithLabelValues(scope)); got != want {
						t.Errorf("write_errors_total{scope=%q} = %v, want %v", scope, got, want)
					}
				}
			})
		})
	}
}

func count(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
