package describe

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwxv1alpha1 "sigs.k8s.io/gateway-api/apisx/v1alpha1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// A route or XBackend whose status other controllers' entries fill has no
// entry toward the Service, and no condition can say so: describe lists
// it with why, as it does a policy's target. Before, the route was not
// listed, nor (until translate counted an XBackend's room) the XBackend.
func TestServiceObjectWithoutRoom(t *testing.T) {
	theirs := func(i int) gwv1.ParentReference {
		return gwv1.ParentReference{Name: gwv1.ObjectName(fmt.Sprintf("gw%02d", i))}
	}
	group, kind := gwv1.Group(""), gwv1.Kind("Service")
	route := &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "crowded", Generation: 1},
		Spec: gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{
			ParentRefs: []gwv1.ParentReference{{Group: &group, Kind: &kind, Name: "web"}}}},
	}
	xb := &gwxv1alpha1.XBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "crowded", Generation: 1},
		Spec: gwxv1alpha1.BackendSpec{Type: gwxv1alpha1.BackendTypeExternalHostname, Port: gwxv1alpha1.BackendPort{Number: 443},
			ExternalHostname: &gwxv1alpha1.ExternalHostnameBackend{Hostname: "api.example.com"}},
	}
	for i := range 32 {
		route.Status.Parents = append(route.Status.Parents, gwv1.RouteParentStatus{ControllerName: "example.com/other", ParentRef: theirs(i)})
		xb.Status.Ancestors = append(xb.Status.Ancestors, gwxv1alpha1.BackendAncestorStatus{ControllerName: "example.com/other", AncestorRef: theirs(i)})
	}
	web := func(annotations map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web", Annotations: annotations},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	}
	for _, tc := range []struct {
		name    string
		in      translate.Input
		objects func(*Service) []Object
	}{{
		name:    "HTTPRoute",
		in:      translate.Input{Services: []*corev1.Service{web(nil)}, HTTPRoutes: []*gwv1.HTTPRoute{route}},
		objects: func(s *Service) []Object { return s.Routes },
	}, {
		name: "XBackend",
		in: translate.Input{Services: []*corev1.Service{web(map[string]string{translate.AnnotationXBackend: "crowded"})},
			XBackends: []*gwxv1alpha1.XBackend{xb}},
		objects: func(s *Service) []Object { return s.XBackends },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
			c, err := New(tc.in, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := c.Service("app", "web")
			if err != nil {
				t.Fatal(err)
			}
			if objs := tc.objects(s); len(objs) != 1 || objs[0].Ref.Name != "crowded" || len(objs[0].Ancestors) != 1 ||
				!strings.Contains(objs[0].Ancestors[0].NoStatus, "32 of them other controllers'") {
				t.Errorf("%ss = %+v, want crowded with no status entry toward app/web, saying why", tc.name, objs)
			}
		})
	}
}
