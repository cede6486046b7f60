package datapath

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// TestTypes checks that every generated Go type has the size of its C
// struct, so Go and the programs agree on map keys and values.
func TestTypes(t *testing.T) {
	spec, err := loadSockmesh()
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]any{
		"sm_service_key": sockmeshSmServiceKey{},
		"sm_service":     sockmeshSmService{},
		"sm_pair_key":    sockmeshSmPairKey{},
		"sm_pair_counts": sockmeshSmPairCounts{},
		"sm_proxy":       sockmeshSmProxy{},
		"sm_orig_dst":    sockmeshSmOrigDst{},
		"sm_app_sock":    sockmeshSmAppSock{},
		"sm_handoff_key": sockmeshSmHandoffKey{},
		"sm_flow":        sockmeshSmFlow{},
		"sm_decide_args": sockmeshSmDecideArgs{},
		"sm_answer_args": sockmeshSmAnswerArgs{},
	}
	for name, goValue := range types {
		var typ *btf.Struct
		if err := spec.Types.TypeByName(name, &typ); err != nil {
			t.Errorf("C struct %s: %v", name, err)
			continue
		}
		if got, want := binary.Size(goValue), int(typ.Size); got != want {
			t.Errorf("Go %T is %d bytes, C struct %s is %d", goValue, got, name, want)
		}
	}
}
