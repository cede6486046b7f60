package selectorsvc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// Config configures a Writer.
type Config struct {
	// FieldManager names sockmesh in the Services' managedFields (zero:
	// "sockmesh").
	FieldManager string
}

// Writer creates, updates and deletes the generated Services.
type Writer struct {
	cfg  Config
	kube k8s.Interface
	log  *slog.Logger
	ops  *prometheus.CounterVec
}

// New returns a Writer that works through kube.
func New(cfg Config, kube k8s.Interface, log *slog.Logger, reg prometheus.Registerer) (*Writer, error) {
	if cfg.FieldManager == "" {
		cfg.FieldManager = "sockmesh"
	}
	w := &Writer{
		cfg:  cfg,
		kube: kube,
		log:  log.With("component", "selectorsvc"),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_selectorsvc_operations_total",
			Help: "Changes to Services generated for EndpointSelector XBackends, by operation (create, update, delete) and result (ok, error).",
		}, []string{"operation", "result"}),
	}
	if reg != nil {
		if err := reg.Register(w.ops); err != nil {
			return nil, fmt.Errorf("register selectorsvc metrics: %w", err)
		}
	}
	return w, nil
}

// Apply makes the generated Services match want, the Services translate
// returned for in: one with a Name is an existing Service as it should be,
// one with only a GenerateName is to be created; generated Services in
// in.Services that want does not name are deleted. Each Service's change
// goes through g (nil: every one is made).
func (w *Writer) Apply(ctx context.Context, in translate.Input, want []*corev1.Service, g *controlplane.Gate) error {
	existing := make(map[types.NamespacedName]*corev1.Service)
	for _, s := range in.Services {
		if generated(s) {
			existing[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
		}
	}
	var errs []error
	for _, s := range want {
		switch {
		case s.Name == "":
			errs = append(errs, g.Do(ctx, object("create", s.Namespace, s.GenerateName), func(ctx context.Context) error {
				return w.create(ctx, s)
			}))
		default:
			nn := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
			cur, ok := existing[nn]
			delete(existing, nn)
			switch {
			case ok && !headless(cur):
				// Its ClusterIP cannot be taken back in place: the
				// Service is deleted, and the next translation, which
				// finds none, asks for a new one.
				errs = append(errs, g.Do(ctx, object("delete", s.Namespace, s.Name), func(ctx context.Context) error {
					return w.delete(ctx, cur)
				}))
			case ok && drifted(cur, s):
				errs = append(errs, g.Do(ctx, object("update", s.Namespace, s.Name), func(ctx context.Context) error {
					return w.update(ctx, s)
				}))
			}
		}
	}
	for _, nn := range slices.SortedFunc(maps.Keys(existing), func(a, b types.NamespacedName) int {
		return cmp.Compare(a.String(), b.String())
	}) {
		errs = append(errs, g.Do(ctx, object("delete", nn.Namespace, nn.Name), func(ctx context.Context) error {
			return w.delete(ctx, existing[nn])
		}))
	}
	return errors.Join(errs...)
}

// object names the write of a Service for the Gate; a create is named by
// its generateName and checked as RBAC's create (its List beforehand too).
func object(verb, namespace, name string) controlplane.Object {
	return controlplane.Object{Verb: verb, Resource: "services", Namespace: namespace, Name: name}
}

// generated reports whether s is a Service sockmesh made: labelled and
// controlled by an XBackend. Both are required, so a user's Service that
// merely carries the label is never deleted.
func generated(s *corev1.Service) bool {
	if _, ok := s.Labels[translate.LabelXBackend]; !ok {
		return false
	}
	return ownerXBackend(s) != nil
}

func ownerXBackend(s *corev1.Service) *metav1.OwnerReference {
	for i, o := range s.OwnerReferences {
		if o.Kind == "XBackend" && o.Controller != nil && *o.Controller {
			if gv, err := schema.ParseGroupVersion(o.APIVersion); err == nil && gv.Group == gwxv1alpha1.GroupName {
				return &s.OwnerReferences[i]
			}
		}
	}
	return nil
}

// create makes s unless the API server already has a Service for the same
// XBackend: the cache may not show one created a moment ago, and
// generateName would happily make a second.
func (w *Writer) create(ctx context.Context, s *corev1.Service) error {
	owner := ownerXBackend(s)
	if owner == nil {
		return fmt.Errorf("create service for %s/%s: no XBackend controller reference", s.Namespace, s.GenerateName)
	}
	list, err := w.kube.CoreV1().Services(s.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{translate.LabelXBackend: s.Labels[translate.LabelXBackend]}).String(),
	})
	if err != nil {
		w.ops.WithLabelValues("create", "error").Inc()
		return fmt.Errorf("list services for xbackend %s/%s: %w", s.Namespace, owner.Name, err)
	}
	for i := range list.Items {
		if o := ownerXBackend(&list.Items[i]); o != nil && o.UID == owner.UID {
			return nil
		}
	}
	created, err := w.kube.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: w.cfg.FieldManager})
	if err != nil {
		w.ops.WithLabelValues("create", "error").Inc()
		return fmt.Errorf("create service for xbackend %s/%s: %w", s.Namespace, owner.Name, err)
	}
	w.ops.WithLabelValues("create", "ok").Inc()
	w.log.Info("service created", "namespace", created.Namespace, "service", created.Name, "xbackend", owner.Name)
	return nil
}

// headless reports whether s has no ClusterIP, or can be made headless by
// an update: an ExternalName Service has none, while a ClusterIP, once
// allocated, is immutable. A Service generated by a version that gave it
// one, or made ExternalName and back by hand, is not headless.
func headless(s *corev1.Service) bool {
	return s.Spec.ClusterIP == corev1.ClusterIPNone || s.Spec.Type == corev1.ServiceTypeExternalName
}

// drifted reports whether cur differs from want in what sockmesh sets and
// what decides the endpoints: publishNotReadyAddresses makes the
// EndpointSlice controller mark pods that are not ready as ready, and the
// proxy would send them requests; an ExternalName Service has no
// EndpointSlices at all. (A hand edit of ipFamilies can only add or drop
// the selected pods' secondary addresses, never select other pods.)
func drifted(cur, want *corev1.Service) bool {
	if !maps.Equal(cur.Spec.Selector, want.Spec.Selector) ||
		cur.Spec.Type != want.Spec.Type || cur.Spec.ClusterIP != want.Spec.ClusterIP ||
		cur.Spec.PublishNotReadyAddresses != want.Spec.PublishNotReadyAddresses ||
		cur.Labels[translate.LabelXBackend] != want.Labels[translate.LabelXBackend] ||
		len(cur.Spec.Ports) != len(want.Spec.Ports) {
		return true
	}
	for i, p := range want.Spec.Ports {
		c := cur.Spec.Ports[i]
		if c.Port != p.Port || c.TargetPort != p.TargetPort || c.Protocol != p.Protocol || c.Name != p.Name {
			return true
		}
	}
	return false
}

// errNotOurs is update's answer for a Service replaced, since the cache
// saw it, by one sockmesh did not generate.
var errNotOurs = errors.New("replaced by a service sockmesh did not generate")

func (w *Writer) update(ctx context.Context, want *corev1.Service) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := w.kube.CoreV1().Services(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !generated(cur) {
			return errNotOurs
		}
		upd := cur.DeepCopy()
		if upd.Spec.Type == corev1.ServiceTypeExternalName {
			// Back from ExternalName (headless allows it): headless again.
			upd.Spec.ClusterIP, upd.Spec.ClusterIPs, upd.Spec.ExternalName = want.Spec.ClusterIP, []string{want.Spec.ClusterIP}, ""
		}
		upd.Spec.Type = want.Spec.Type
		upd.Spec.Selector = want.Spec.Selector
		upd.Spec.Ports = want.Spec.Ports
		upd.Spec.PublishNotReadyAddresses = want.Spec.PublishNotReadyAddresses
		if upd.Labels == nil {
			upd.Labels = map[string]string{}
		}
		upd.Labels[translate.LabelXBackend] = want.Labels[translate.LabelXBackend]
		_, err = w.kube.CoreV1().Services(want.Namespace).Update(ctx, upd, metav1.UpdateOptions{FieldManager: w.cfg.FieldManager})
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case errors.Is(err, errNotOurs):
		// Left alone: the watch brings the replacement, and translate
		// then asks for a Service of ours anew.
		w.log.Debug("service not ours; left alone", "namespace", want.Namespace, "service", want.Name)
		return nil
	case err != nil:
		w.ops.WithLabelValues("update", "error").Inc()
		return fmt.Errorf("update service %s/%s: %w", want.Namespace, want.Name, err)
	}
	w.ops.WithLabelValues("update", "ok").Inc()
	w.log.Info("service updated", "namespace", want.Namespace, "service", want.Name)
	return nil
}

func (w *Writer) delete(ctx context.Context, s *corev1.Service) error {
	// The UID precondition keeps a stale cache from deleting a Service
	// that was recreated under the same name.
	uid := s.UID
	err := w.kube.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		w.ops.WithLabelValues("delete", "error").Inc()
		return fmt.Errorf("delete service %s/%s: %w", s.Namespace, s.Name, err)
	}
	w.ops.WithLabelValues("delete", "ok").Inc()
	w.log.Info("service deleted", "namespace", s.Namespace, "service", s.Name)
	return nil
}
