package enrol

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sockmesh/sockmesh/agent/cniwire"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
)

// record is a handover as the Enroller keeps it in Config.Handovers, one
// file a sandbox: what the next agent needs to hold the pod enrolled until
// the Snapshot has its address.
type record struct {
	// Workload is the one Adopt took, with the addresses the CNI plugins
	// gave the pod: find looks for its namespace by them.
	Workload snapshot.Workload `json:"workload"`
	// Enrolment is the namespace's entry in the enrolment map, which the
	// next agent writes until find found the namespace: a namespace's
	// cookie is never reused while the node runs, and the namespace may not
	// be found at once (until the sandbox's first process starts, only the
	// runtime's bind mount, which the agent's container does not see,
	// holds it).
	Enrolment enrolment `json:"enrolment"`
}

// enrolment is one entry of the enrolment map.
type enrolment struct {
	NetNSCookie uint64         `json:"netnsCookie"`
	Proxy       datapath.Proxy `json:"proxy"`
}

// writeRecord records p's handover, before the enrolment map holds it: an
// agent starting beside this one (a rolling update) then keeps it whenever
// it writes the map. Called with e.mu held.
func (e *Enroller) writeRecord(p *pod) error {
	if e.cfg.Handovers == "" {
		return nil
	}
	path, err := cniwire.Record(e.cfg.Handovers, p.sandbox)
	if err != nil {
		return err
	}
	n := e.netns[p.ino]
	data, err := json.Marshal(record{Workload: p.w, Enrolment: enrolment{n.cookie, n.proxy}})
	if err != nil {
		return fmt.Errorf("encode the handover record: %w", err)
	}
	if err := os.MkdirAll(e.cfg.Handovers, 0o700); err != nil {
		return fmt.Errorf("create the handover records' directory: %w", err)
	}
	// By rename: an agent reading records never sees half of one. The
	// temporary name has no .json: no agent reads it.
	tmp, err := os.CreateTemp(e.cfg.Handovers, ".record-*")
	if err != nil {
		return fmt.Errorf("write handover record %s: %w", path, err)
	}
	_, err = tmp.Write(data)
	if err = errors.Join(err, tmp.Close()); err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write handover record %s: %w", path, err)
	}
	p.recorded = true
	return nil
}

// forget removes p's record, if it has one: the Snapshot confirmed the
// pod, or no longer holds it where the handover put it. Called with e.mu
// held.
func (e *Enroller) forget(p *pod) {
	if !p.recorded {
		return
	}
	p.recorded = false
	path, err := cniwire.Record(e.cfg.Handovers, p.sandbox)
	if err == nil {
		err = os.Remove(path)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.Warn("remove handover record failed", "pod", p.w.Pod.String(), "sandbox", p.sandbox, "err", err)
	}
}

// restore takes over the handovers recorded by other agents (the one
// before this, or beside it during a rolling update) of pods e holds
// nothing of, or holds as an older sandbox (supersedes): each is Pending,
// handed over, its recorded enrolment written meanwhile, until find enrols
// it by the addresses the CNI plugins gave it (a scan: the agent's
// container does not see the runtime's namespace paths). Throughout
// keepHandedOver decides, as for the pods this agent adopted, and the
// record goes with the pod or when the Snapshot confirms it; the plugin
// removes a sandbox's at CNI DEL.
// Called with e.mu held, at each reconcile: before the enrolment map is
// written, whichever agent adopted the pod.
func (e *Enroller) restore(now time.Time) {
	e.records = nil
	if e.cfg.Handovers == "" {
		return
	}
	ents, err := os.ReadDir(e.cfg.Handovers)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			e.log.Warn("read handover records failed", "dir", e.cfg.Handovers, "err", err)
		}
		return
	}
	held := make(map[string]bool, len(e.pods))
	for _, p := range e.pods {
		held[p.sandbox] = true
	}
	e.records = make(map[string]time.Time, len(ents))
	for _, ent := range ents {
		sandbox, ok := strings.CutSuffix(ent.Name(), ".json")
		if info, err := ent.Info(); ok && err == nil && !ent.IsDir() {
			e.records[sandbox] = info.ModTime()
		}
	}
	for _, ent := range ents {
		sandbox, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || ent.IsDir() || held[sandbox] {
			continue
		}
		path := filepath.Join(e.cfg.Handovers, ent.Name())
		r, err := readRecord(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // the agent beside this one removed it meanwhile
		}
		if err != nil {
			// Written by rename, a record is whole: this one is no
			// agent's, and would be warned about at every reconcile.
			e.log.Warn("handover record unusable: removed", "sandbox", sandbox, "err", err)
			os.Remove(path)
			continue
		}
		k := podKey{r.Workload.Pod, r.Workload.UID}
		if old, ok := e.pods[k]; ok && !e.supersedes(r, sandbox, old) {
			continue // this agent knows the pod already
		}
		carried := r.Enrolment
		if e.cfg.Mode == NodeIP {
			carried.Proxy = e.cfg.NodeProxy // this agent's
		}
		e.pods[k] = &pod{w: r.Workload, state: Pending, reason: "handed over to another agent, not looked for yet", since: now,
			handedOver: true, sandbox: sandbox, recorded: true, carried: &carried}
		e.log.Info("pod handover taken over", "pod", r.Workload.Pod.String(), "sandbox", sandbox, "netns_cookie", carried.NetNSCookie)
	}
}

// supersedes reports whether r, the record of sandbox, another sandbox of
// the pod held here as old, is the pod's newer sandbox. The kubelet stops
// a pod's sandbox (CNI DEL, which removes its record) before it makes the
// next one, and makes none while the stop fails: a record is of the pod's
// newest sandbox. It is newer than a sandbox handed over here whose record
// went, and than the one whose address the API server lists, unless that
// one was ready after the record was written (a DEL that never came: the
// runtime lost the sandbox). The pod enrolled already at the record's
// addresses is in its namespace. Called with e.mu held, in restore.
func (e *Enroller) supersedes(r record, sandbox string, old *pod) bool {
	switch {
	case old.handedOver:
		_, recorded := e.records[old.sandbox]
		return !recorded
	case old.state == Enrolled && sameAddrs(old.w.IPs, r.Workload.IPs):
		return false
	}
	return e.recordNewer(sandbox, old.w)
}

// recordNewer reports whether sandbox's record, as restore last read the
// directory, is there and newer than the sandbox of w, the pod as the
// Snapshot lists it (see supersedes).
func (e *Enroller) recordNewer(sandbox string, w snapshot.Workload) bool {
	at, ok := e.records[sandbox]
	return ok && !w.SandboxReady.After(at)
}

func readRecord(path string) (record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return record{}, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return record{}, fmt.Errorf("parse %s: %w", path, err)
	}
	if w := r.Workload; w.Pod.Namespace == "" || w.Pod.Name == "" || len(w.IPs) == 0 || r.Enrolment.NetNSCookie == 0 {
		return record{}, fmt.Errorf("%s names no pod, address or network namespace", path)
	}
	return r, nil
}
