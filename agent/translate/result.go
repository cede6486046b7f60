package translate

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Result is Translate's output: the parts of the next Snapshot (the agent
// numbers the version when it publishes), the status to write, and the
// objects sockmesh must own in the cluster.
type Result struct {
	Frontends []snapshot.Frontend
	Backends  []snapshot.Backend
	Workloads []snapshot.Workload
	Status    Status
	// EndpointSelectorServices are the headless Services that EndpointSelector
	// XBackends need (one per XBackend, generateName, ownerReference to it).
	// The writer creates missing ones and deletes those no longer wanted;
	// Translate finds existing ones in Input.Services by the label
	// LabelXBackend.
	EndpointSelectorServices []*corev1.Service
}

// LabelXBackend marks a headless Service sockmesh generated for an
// EndpointSelector XBackend; its value is the XBackend's name.
const LabelXBackend = "sockmesh.io/xbackend"
