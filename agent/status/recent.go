package status

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// recent remembers, per object (by UID), the newest version of it this
// Writer wrote or read, and the version of the translation pass it was
// handed then. The control plane hands a pass again while the API server is
// in trouble and whenever its Gate lets a held-back object through, and a
// status-only change never brings the pass newer objects: without this memory, every retry would merge against the stale
// object, find our status missing and patch again (a conflict, a GET and a
// re-merge per object, every retry).
//
// resourceVersions are opaque: they are compared for equality only. An
// object handed with the version remembered as the pass's is stale, and the
// remembered one stands in for it. Any other version is either the one
// remembered as written (the cache caught up) or a write of someone else's
// the cache saw: either way the object handed is current enough, and the
// entry is forgotten.
//
// The memory lasts one leader term: in the next one, another agent may
// have written since. An entry lasts until the object is handed again with
// another version, or a Write is handed no longer the object at all.
type recent struct {
	mu    sync.Mutex
	term  <-chan struct{}
	write uint64 // counts Writes, to find entries a Write did not use
	byUID map[types.UID]recentObject
}

type recentObject struct {
	passVersion string        // resourceVersion of the object the pass held
	obj         metav1.Object // the newest version seen, managedFields dropped
	used        uint64        // the last Write that looked it up
}

// begin starts a Write in term (its ctx's Done channel): a new term
// forgets everything.
func (r *recent) begin(term <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.term != term || r.byUID == nil {
		r.term, r.byUID = term, map[types.UID]recentObject{}
	}
	r.write++
}

// end forgets the objects the Write that began last did not look up: ones
// the pass no longer holds (deleted, or no status of ours), so the memory
// never outgrows one pass.
func (r *recent) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, e := range r.byUID {
		if e.used != r.write {
			delete(r.byUID, uid)
		}
	}
}

// current returns what to merge against for obj, the pass's version of an
// object: the newest version remembered if obj is the one it was
// remembered for, else obj.
func current[O metav1.Object](r *recent, obj O) O {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byUID[obj.GetUID()]
	if !ok {
		return obj
	}
	newer, ok := e.obj.(O)
	if !ok || obj.GetResourceVersion() != e.passVersion {
		delete(r.byUID, obj.GetUID())
		return obj
	}
	e.used = r.write
	r.byUID[obj.GetUID()] = e
	return newer
}

// remember records obj, just written or read, as the newest version of the
// object the pass held at passVersion. It is not kept if it is that
// version, or has no UID to be found by.
func (r *recent) remember(passVersion string, obj metav1.Object) {
	if obj.GetUID() == "" || obj.GetResourceVersion() == passVersion {
		return
	}
	// Like the source's cache: managedFields and kubectl's copy of the
	// object are never read, and are most of a status object's size.
	obj.SetManagedFields(nil)
	if a := obj.GetAnnotations(); a[corev1.LastAppliedConfigAnnotation] != "" {
		delete(a, corev1.LastAppliedConfigAnnotation)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byUID[obj.GetUID()] = recentObject{passVersion: passVersion, obj: obj, used: r.write}
}

func (r *recent) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byUID)
}
