// Command sockmesh-cni is sockmesh's chained CNI plugin. Listed after the
// plugins that set a pod's network up (the node's conflist), it hands the
// pod's network namespace over to the node's sockmesh agent at ADD and
// returns only once the agent has enrolled it, or said the pod is not
// captured: a pod's first connections are captured, not only those after
// the API server published its address. When the agent does neither in
// time, ADD fails and the kubelet makes the sandbox again later, so that no
// container of a captured pod runs uncaptured; pods of the namespaces the
// configuration exempts start anyway (the cluster's own, which may be
// needed to bring the agent back). It passes the previous plugins' result
// through untouched. DEL removes the record the agent kept of the
// sandbox's handover (for the next agent); CHECK checks the configuration.
//
// Its configuration, beside the CNI fields:
//
//	"socket": the agent's socket (default /run/sockmesh/cni/cni.sock)
//	"timeout": how long ADD waits for the agent, a Go duration (default 10s;
//	  the agent writes its --cni-timeout)
//	"exemptNamespaces": namespaces whose pods start when the agent cannot
//	  answer (default none; the DaemonSet's entry lists kube-system)
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
)

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck},
		version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"),
		"sockmesh-cni: hands a pod's network namespace to the node's sockmesh agent while its sandbox is made")
}
