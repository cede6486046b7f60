package describe

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// A route whose status other controllers' entries fill has no entry toward
// the Service, and no condition can say so: describe lists the route with
// why, as it does a policy's target. Before, the route was not listed.
func TestServiceRouteWithoutRoom(t *testing.T) {
	group, kind := gwv1.Group(""), gwv1.Kind("Service")
	route := &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "crowded", Generation: 1},
		Spec: gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{
			ParentRefs: []gwv1.ParentReference{{Group: &group, Kind: &kind, Name: "web"}}}},
	}
	for i := range 32 {
		route.Status.Parents = append(route.Status.Parents, gwv1.RouteParentStatus{
			ControllerName: "example.com/other", ParentRef: gwv1.ParentReference{Name: gwv1.ObjectName(fmt.Sprintf("gw%02d", i))}})
	}
	c, err := New(translate.Input{
		Now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC),
		Services: []*corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}},
		HTTPRoutes: []*gwv1.HTTPRoute{route},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Service("app", "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Routes) != 1 || s.Routes[0].Ref.Name != "crowded" || len(s.Routes[0].Ancestors) != 1 ||
		!strings.Contains(s.Routes[0].Ancestors[0].NoStatus, "32 of them other controllers'") {
		t.Errorf("routes = %+v, want crowded with no status entry toward app/web, saying why", s.Routes)
	}
}
