package controlplane

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/test/pki"
)

// partnerManifests are what a user would put in the file source's
// directory: an EndpointSelector XBackend with mutual TLS, its client key
// pair's Secret (CRT and KEY are replaced), and a Service that leads to it.
const partnerManifests = `
apiVersion: v1
kind: Secret
metadata: {name: partner-client, namespace: shop}
type: kubernetes.io/tls
stringData: {tls.crt: CRT, tls.key: KEY}
---
apiVersion: gateway.networking.x-k8s.io/v1alpha1
kind: XBackend
metadata: {name: partner, namespace: shop, generation: 1}
spec:
  type: EndpointSelector
  endpointSelector: {matchLabels: {app: partner}}
  port: {number: 443}
  tls:
    mode: ClientAndServer
    clientCertificateRef: {name: partner-client}
    validation: {hostname: partner.example, wellKnownCACertificates: System}
---
apiVersion: v1
kind: Service
metadata: {name: partner, namespace: shop, annotations: {sockmesh.io/xbackend: partner}}
spec: {clusterIP: 10.96.30.1, ports: [{name: app, port: 8080}]}
`

// runPartner runs a control plane on partnerManifests, decoded by the file
// source's decoder, with a client certificate valid from notBefore to
// notAfter, translating again after resync with no signal; its writer
// records each translation it is handed.
func runPartner(t *testing.T, notBefore, notAfter time.Time, resync time.Duration) (*ControlPlane, *flakyWriter) {
	t.Helper()
	ca, err := pki.NewCA("partner client CA")
	if err != nil {
		t.Fatal(err)
	}
	// translate judges the key pair and its dates, not who signed it.
	leaf, err := ca.Issue(pki.LeafOptions{CommonName: "client", Client: true, NotBefore: notBefore, NotAfter: notAfter})
	if err != nil {
		t.Fatal(err)
	}
	crt, key := leaf.CertPEM, leaf.KeyPEM
	quote := func(b []byte) string {
		q, err := json.Marshal(string(b))
		if err != nil {
			t.Fatal(err)
		}
		return string(q)
	}
	text := strings.NewReplacer("CRT", quote(crt), "KEY", quote(key)).Replace(partnerManifests)
	dec, err := manifests.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := dec.Decode(bytes.NewReader([]byte(text)))
	if err != nil {
		t.Fatalf("decode manifests: %v", err)
	}
	var in translate.Input
	for _, o := range objs {
		if err := manifests.Add(&in, o); err != nil {
			t.Fatal(err)
		}
	}
	w := &flakyWriter{}
	c, err := New(Config{Writers: []Writer{w}, Resync: resync}, newMemSource(in), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	synctest.Wait()
	return c, w
}

// partnerState is what the published Snapshot and the last status written
// say of the partner XBackend: its Backend's TLS mode, or the reason it
// fails closed, and its Accepted condition.
func partnerState(t *testing.T, c *ControlPlane, w *flakyWriter) (version uint64, backend string, accepted metav1.Condition) {
	t.Helper()
	s := c.Snapshot()
	b, ok := s.Backend(snapshot.BackendRef{Kind: snapshot.KindXBackend, Namespace: "shop", Name: "partner", Port: 443})
	switch {
	case !ok:
		t.Fatalf("snapshot %d has no backend for XBackend shop/partner: %+v", s.Version, s.Backends)
	case b.Invalid != nil:
		backend = "invalid: " + b.Invalid.Reason
	case b.TLS != nil:
		backend = "tls: " + string(b.TLS.Mode)
	}
	w.mu.Lock()
	ancestors := w.last.Status.XBackends[types.NamespacedName{Namespace: "shop", Name: "partner"}]
	w.mu.Unlock()
	if len(ancestors) != 1 {
		t.Fatalf("status of XBackend shop/partner has %d ancestors, want 1", len(ancestors))
	}
	cond := meta.FindStatusCondition(ancestors[0].Conditions, string(gwxv1alpha1.BackendConditionAccepted))
	if cond == nil {
		t.Fatalf("status of XBackend shop/partner has no Accepted condition: %+v", ancestors[0].Conditions)
	}
	return s.Version, backend, *cond
}

// TestClientCertificateExpiresWithoutChange: an XBackend whose client
// certificate expires at T is Accepted, with mutual TLS, until T (valid
// through its NotAfter), and Invalid, failing closed, right after it,
// though no object changed; then nothing is translated again, for no
// judgement waits on the time any more.
func TestClientCertificateExpiresWithoutChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		expiry := start.Add(90 * time.Minute)
		c, w := runPartner(t, start.Add(-time.Hour), expiry, noResync)

		want := func(when string, version uint64, backend string, status metav1.ConditionStatus, reason, message string) {
			t.Helper()
			v, b, cond := partnerState(t, c, w)
			if v != version || b != backend || cond.Status != status || cond.Reason != reason || !strings.Contains(cond.Message, message) {
				t.Errorf("%s: snapshot %d with backend %q, Accepted=%s/%s %q; want snapshot %d with backend %q, Accepted=%s/%s saying %q",
					when, v, b, cond.Status, cond.Reason, cond.Message, version, backend, status, reason, message)
			}
		}
		want("at start", 1, "tls: "+string(snapshot.TLSMutual), metav1.ConditionTrue, "Accepted", "go to this XBackend")

		time.Sleep(time.Until(expiry))
		synctest.Wait()
		want("at NotAfter", 1, "tls: "+string(snapshot.TLSMutual), metav1.ConditionTrue, "Accepted", "go to this XBackend")
		if n := w.count(); n != 1 {
			t.Errorf("%d translations written by NotAfter, want 1", n)
		}

		time.Sleep(time.Second)
		synctest.Wait()
		want("a second after NotAfter", 2, "invalid: Invalid", metav1.ConditionFalse, "Invalid", "certificate expired at "+expiry.UTC().Format(time.RFC3339))

		time.Sleep(72 * time.Hour)
		synctest.Wait()
		if n := w.count(); n != 2 {
			t.Errorf("%d translations written three days after expiry, want 2 (none once no judgement waits on the time)", n)
		}
	})
}

// TestClientCertificateBecomesValidWithoutChange: an XBackend whose client
// certificate is valid only from T fails closed until T and is Accepted
// from then on, though no object changed. The loop waits at most its
// Resync (here a day) at a time for that instant, translating again once a
// day (the result unchanged); then for the certificate's NotAfter, the
// last second of 9999 (beyond any Duration from now), also a day at a
// time, never in a loop.
func TestClientCertificateBecomesValidWithoutChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		validFrom := start.Add(50 * time.Hour)
		c, w := runPartner(t, validFrom, time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), 24*time.Hour)

		check := func(when string, translations int, version uint64, backend string, accepted metav1.ConditionStatus) {
			t.Helper()
			v, b, cond := partnerState(t, c, w)
			if n := w.count(); n != translations || v != version || b != backend || cond.Status != accepted {
				t.Errorf("%s: %d translations, snapshot %d with backend %q, Accepted=%s (%s); want %d, snapshot %d with %q, Accepted=%s",
					when, n, v, b, cond.Status, cond.Message, translations, version, backend, accepted)
			}
		}
		check("at start", 1, 1, "invalid: Invalid", metav1.ConditionFalse)
		// The first wait is capped at the resync: the same result again.
		time.Sleep(24*time.Hour - time.Second)
		synctest.Wait()
		check("just before a day", 1, 1, "invalid: Invalid", metav1.ConditionFalse)
		time.Sleep(time.Second)
		synctest.Wait()
		check("after a day", 2, 1, "invalid: Invalid", metav1.ConditionFalse)
		time.Sleep(time.Until(validFrom) - time.Second)
		synctest.Wait()
		check("a second before NotBefore", 3, 1, "invalid: Invalid", metav1.ConditionFalse)
		time.Sleep(time.Second)
		synctest.Wait()
		check("at NotBefore", 4, 2, "tls: "+string(snapshot.TLSMutual), metav1.ConditionTrue)
		time.Sleep(24 * time.Hour)
		synctest.Wait()
		check("a day after NotBefore", 5, 2, "tls: "+string(snapshot.TLSMutual), metav1.ConditionTrue)
	})
}
