package snapshot

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestNewChecksRoutes(t *testing.T) {
	be := BackendRef{Kind: KindService, Namespace: "mesh", Name: "echo", Port: 80}
	missing := BackendRef{Kind: KindService, Namespace: "mesh", Name: "gone", Port: 80}
	frontend := func(rs RouteSet) Frontend {
		return Frontend{Service: ObjectRef{Namespace: "mesh", Name: "echo"}, Port: 80,
			Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Backend: be, Routes: &RouteTable{Producer: &rs}}
	}
	rule := func(wb WeightedBackend, mirrors ...Mirror) RouteRule {
		return RouteRule{Backends: []WeightedBackend{wb}, Filters: Filters{Mirrors: mirrors}}
	}
	match := []RouteMatch{{Rule: 0, Path: PathMatch{Type: PathPrefix, Value: "/"}}}
	tests := []struct {
		name    string
		set     RouteSet
		wantErr string
	}{
		{"valid", RouteSet{Matches: match, Rules: []RouteRule{rule(WeightedBackend{Weight: 1, Backend: be})}}, ""},
		{"invalid backendRef names nothing", RouteSet{Matches: match, Rules: []RouteRule{rule(WeightedBackend{Weight: 1, Invalid: &Invalid{Reason: "BackendNotFound"}})}}, ""},
		{"missing backend", RouteSet{Matches: match, Rules: []RouteRule{rule(WeightedBackend{Weight: 1, Backend: missing})}}, "backend Service/mesh/gone:80 missing"},
		{"missing mirror", RouteSet{Matches: match, Rules: []RouteRule{rule(WeightedBackend{Weight: 1, Backend: be}, Mirror{Backend: missing, Numerator: 1, Denominator: 1})}}, "backend Service/mesh/gone:80 missing"},
		{"rule out of range", RouteSet{Matches: []RouteMatch{{Rule: 1}}, Rules: []RouteRule{rule(WeightedBackend{Weight: 1, Backend: be})}}, "match names rule 1 of 1"},
	}
	for _, tc := range tests {
		_, err := New(1, []Frontend{frontend(tc.set)}, []Backend{{Ref: be}}, nil)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: New error %v, want none", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: New error %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestDurationText(t *testing.T) {
	in := Timeouts{Request: ptr(Duration(1500 * time.Millisecond)), BackendRequest: ptr(Duration(0))}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"request":"1.5s","backendRequest":"0s"}` {
		t.Errorf("json.Marshal(%+v) = %s", in, b)
	}
	var out Timeouts
	if err := json.Unmarshal(b, &out); err != nil || *out.Request != *in.Request || *out.BackendRequest != 0 {
		t.Errorf("round trip = %+v, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"request":"soon"}`), &out); err == nil {
		t.Errorf("json.Unmarshal of a bad duration: no error")
	}
}

func ptr[T any](v T) *T { return &v }
