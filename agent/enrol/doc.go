// Package enrol turns the Snapshot's enrolled workloads into datapath
// enrolments: for each pod it finds the network namespace that holds the
// pod's IP (podns), reads that namespace's cookie, and writes the cookie
// with the pod's proxy address into the datapath's enrolment map. In
// in-pod mode it also opens the proxy's listeners inside the pod's
// namespace, on its loopback addresses (IPv4 and IPv6 where the namespace
// has them), hands them to the proxy and closes them when the pod goes.
//
// An in-pod listener names its pod as every connection's client (the
// proxy applies that pod's namespace's consumer routes) only while that
// pod alone is enrolled in the namespace. In the node's namespace, which
// host-network pods share with every host process, it names the node: one
// client of no namespace, whatever the family, which gets the producer
// routes alone. With several pods it names none and the proxy finds the
// client by address. Its listeners are opened again when that changes.
//
// A pod's namespace may appear after its Pod object (the file source, or a
// slow CNI), and may be replaced while the Pod object stays: the Enroller
// looks again for pods it has not found after Config.Retry (the wait
// doubling, up to 16 times Config.Retry, while some stay unfound, since
// each look scans every namespace on the node), looks again at once for a
// pod whose Workload.SandboxReady changed (the kubelet recreated its
// sandbox), and checks every Config.Verify that the namespaces it found
// still hold their pod's address (a sandbox replaced unannounced).
//
// A pod's address reaches the Snapshot only after its first container
// started. The CNI plugin hands the pod's namespace over earlier, while the
// sandbox is made: Adopt enrols it at once, and the pod stays enrolled
// there until a Snapshot lists it with an address (then it is the
// Snapshot's pod, found already), or with an address and not enrolled, or
// no longer lists it. Workload waits for the Snapshot that lists the pod,
// for the caller to decide. Meanwhile a record of the handover, a file in
// Config.Handovers, carries it over to the next agent (a rolling update, a
// restart): each reconcile takes over the records of pods it holds nothing
// of, or holds as an older sandbox (the API server lists the address of
// the one the kubelet made before), and writes their recorded enrolment
// until it finds their namespace.
//
// Enrolments are written only after the first Update: an agent that
// restarts keeps the enrolments its predecessor pinned until it knows
// better. Close releases listeners and namespaces but leaves the
// enrolments in place, for the next agent.
//
// It must not decide which pods are enrolled (translate does, in the
// Snapshot's Workloads) and must not serve connections (the proxy does).
package enrol
