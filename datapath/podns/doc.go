// Package podns finds and works inside the network namespaces of pods on
// this node, without Kubernetes: the agent maps a Snapshot Workload to its
// netns by IP, enrols the netns by cookie, and in in-pod mode opens the
// proxy's listener inside it; an agent run by hand takes its node-ip
// listener addresses from its own netns's default routes; and the agent
// follows its own netns's addresses, the node's.
//
//	ns, err := podns.FindByIP(ip)     // scan /var/run/netns and /proc/*/ns/net
//	cookie, err := ns.Cookie()        // SO_NETNS_COOKIE, the datapath's key
//	own, err := podns.CurrentCookie() // the same, for the netns this thread is in
//	ln, err := ns.Listen(ctx, nil, "tcp", "127.0.0.1:15001") // in-pod listener
//	err = ns.Do(func() error { ... }) // any work on a thread inside ns
//	ips, err := ns.DefaultRouteAddrs() // one address per family with a default route
//	w, err := ns.WatchAddrs(ctx, log)  // its global addresses, kept current by w.Run(ctx)
//
// Entering a netns is per OS thread. Do runs its function on a fresh
// goroutine locked to its thread and puts the thread back into its own netns
// afterwards; if that fails the thread is never unlocked, so the Go runtime
// destroys it instead of reusing it with the wrong netns. Sockets keep the
// netns they were created in, so a listener or netlink handle created inside
// Do stays there.
//
// It must not import Kubernetes code, and it never changes a namespace's
// configuration (addresses, routes, links): it only reads and opens sockets.
package podns
