// Package resolve keeps the DNS answers for the hostnames of ExternalHostname
// XBackends current: the control plane says which hostnames it needs
// (SetHostnames), the Resolver looks each one up (A and AAAA), refreshes it
// when its TTL runs out — never sooner than Config.MinInterval, never later
// than Config.MaxInterval — and signals Changed when an answer set changes.
// Answers feeds translate.Input.Resolved. A failed lookup keeps a record
// type's last addresses for Config.MaxStale, then drops them (fail closed);
// at most Config.Parallel lookups run at once.
//
// It speaks DNS itself (golang.org/x/net/dns/dnsmessage over UDP, TCP when a
// reply is truncated) rather than through net.Resolver, because net.Resolver
// hides the TTLs that decide when to look again.
//
// It only resolves. It must not judge the answers: refusing addresses in
// loopback, link-local, node, pod or service ranges is translate's job, in
// one pure place, so that the file source and the tests see the same rule.
package resolve
