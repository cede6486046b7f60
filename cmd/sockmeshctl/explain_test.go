package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

func TestParseDestination(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    destination
		wantErr string
	}{
		{in: "secure:443", want: destination{service: snapshot.ObjectRef{Namespace: "app", Name: "secure"}, port: "443"}},
		{in: "secure.web.svc.cluster.local:https", want: destination{service: snapshot.ObjectRef{Namespace: "web", Name: "secure"}, port: "https"}},
		{in: "web/secure:443", want: destination{service: snapshot.ObjectRef{Namespace: "web", Name: "secure"}, port: "443"}},
		{in: "10.96.0.10:80", want: destination{addr: netip.MustParseAddr("10.96.0.10"), port: "80"}},
		{in: "[fd00::10]:80", want: destination{addr: netip.MustParseAddr("fd00::10"), port: "80"}},
		{in: "[::ffff:10.96.0.10]:80", want: destination{addr: netip.MustParseAddr("10.96.0.10"), port: "80"}},
		// Without brackets the port cannot be told from the address; the
		// answer says how to write it rather than that it is no IP:PORT.
		{in: "fd00::10:80", wantErr: "write an IPv6 address in brackets: [fd00::10]:80"},
		{in: "secure", wantErr: "want SERVICE:PORT, IPv4:PORT or [IPv6]:PORT"},
		{in: "a.b.c:80", wantErr: "want NAME, NAME.NAMESPACE or NAME.NAMESPACE.svc"},
		{in: "web/:80", wantErr: "empty namespace or name"},
	} {
		got, err := parseDestination(c.in, "app")
		switch {
		case c.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("parseDestination(%q) = %+v, %v; want an error saying %q", c.in, got, err, c.wantErr)
			}
		case err != nil || got != c.want:
			t.Errorf("parseDestination(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func TestParseRef(t *testing.T) {
	for _, c := range []struct {
		in   string
		want snapshot.ObjectRef
	}{
		{"client", snapshot.ObjectRef{Namespace: "app", Name: "client"}},
		{"web/client", snapshot.ObjectRef{Namespace: "web", Name: "client"}},
	} {
		if got, err := parseRef(c.in, "app"); err != nil || got != c.want {
			t.Errorf("parseRef(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	// Each reached the API server as a name it refused or a namespace it
	// listed ("Service app/: not found" for "app/").
	for _, in := range []string{"app/", "/client", "", "app/client/x"} {
		if got, err := parseRef(in, "app"); err == nil || !strings.Contains(err.Error(), "want NAME or NAMESPACE/NAME") {
			t.Errorf("parseRef(%q) = %+v, %v; want an error", in, got, err)
		}
	}
}
