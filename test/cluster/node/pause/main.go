// Command pause is the sandbox ("pause") container of the test node: the
// first process of every pod, holding the pod's namespaces open while the
// pod's containers come and go. The node has no registry to pull
// registry.k8s.io/pause from, so it is built here and imported as the
// containerd sandbox_image.
//
// It waits for SIGINT or SIGTERM and exits 0. As PID 1 of a pod that shares
// its PID namespace it also reaps orphans, as the upstream pause does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// One SIGCHLD can stand for several exited children.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
