// Package cnihandover is the agent's side of sockmesh's CNI plugin
// (cmd/sockmesh-cni). At CNI ADD, while the kubelet makes a pod's sandbox
// and before any of its containers runs, the plugin hands the pod's network
// namespace over and waits for the answer the Server gives: the namespace
// is enrolled (its connections are captured from the first), or the pod is
// not captured anyway. Anything else fails the ADD, and the kubelet makes
// the sandbox again later: no container of a captured pod runs uncaptured.
//
// The Server serves a unix socket in a host directory only root may enter
// (Listen; the kubelet runs the plugin as root on the node); the protocol
// is cniwire's, which the plugin links alone.
//
// It must not decide whether a pod is captured, nor enrol it: the agent's
// Enroller does, behind the Enroller interface.
package cnihandover
