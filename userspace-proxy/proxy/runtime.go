package proxy

// RuntimeSettings are the GODEBUG settings a process running the proxy
// needs from its start (the runtime and net/http read GODEBUG once, at
// init). The agent re-executes itself with those its environment does not
// mention (one that sets a key either way is left alone), the DaemonSet
// sets them, and the proxy benchmark runs with them.
//
//   - http2xconnect=1: net/http's HTTP/2 server accepts extended CONNECT
//     (RFC 8441), which WebSocket over HTTP/2 needs.
//   - schedtrace=2147483647: with a schedtrace period set, the runtime's
//     sysmon thread never takes its deep sleep when every P is idle. A
//     proxy idles between bursts most of the time, and then its next
//     tracked system call (accept, close) woke sysmon, which polled every
//     20 µs again: measured with a connection per request, sysmon's sleeps
//     were 42 % of the proxy's context switches, and the setting cut the
//     proxy's CPU per request by 14 % (test/bench/proxy, A/B in one run).
//     Never in deep sleep, sysmon backs off to one wakeup per 10 ms. The
//     value is the trace period in milliseconds, the largest there is
//     (24.8 days): on a node up for longer, the runtime prints one
//     scheduler line to stderr when the agent starts and one per period.
var RuntimeSettings = []string{"http2xconnect=1", "schedtrace=2147483647"}
