package datapath

import (
	"maps"
	"slices"
	"testing"
)

// TestNewerOpenOwnsTheMaps: two agents on one node, as a rolling update
// with maxSurge runs them. Once the newer has opened the datapath the older
// writes nothing, whatever order their writes come in: its view (another
// build's, another proxy mode's) would otherwise stay whenever it wrote
// last.
func TestNewerOpenOwnsTheMaps(t *testing.T) {
	tp := newTopology(t)
	older := tp.open(t)
	if err := older.SetServices([]Service{{Addr: vip4}}); err != nil {
		t.Fatal(err)
	}
	if err := older.SetEnrolments(map[uint64]Proxy{tp.podCookie: tp.nodeProxy()}); err != nil {
		t.Fatal(err)
	}
	newer := tp.open(t)
	for _, c := range []struct {
		name string
		d    *Datapath
		want bool
	}{{"older", older, true}, {"newer", newer, false}} {
		running, ours, err := c.d.owner()
		if err != nil {
			t.Fatal(err)
		}
		if superseded := running != ours; superseded != c.want {
			t.Errorf("%s agent: superseded = %v (links run program %d, its own is %d), want %v", c.name, superseded, running, ours, c.want)
		}
	}

	if err := newer.SetServices([]Service{{Addr: vip6}}); err != nil {
		t.Fatal(err)
	}
	if err := newer.SetEnrolments(map[uint64]Proxy{}); err != nil {
		t.Fatal(err)
	}
	// The older agent writes after the newer: nothing of it may land.
	if err := older.SetServices([]Service{{Addr: vip4}}); err != nil {
		t.Fatal(err)
	}
	if err := older.SetEnrolments(map[uint64]Proxy{tp.podCookie: tp.nodeProxy()}); err != nil {
		t.Fatal(err)
	}
	svcs, err := newer.Services()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(svcs, []Service{{Addr: vip6}}) {
		t.Errorf("services = %v, want the newer agent's [%v]", svcs, vip6)
	}
	enrolled, err := newer.Enrolments()
	if err != nil {
		t.Fatal(err)
	}
	if len(enrolled) != 0 {
		t.Errorf("enrolments = %v, want the newer agent's (none)", slices.Collect(maps.Keys(enrolled)))
	}
}
