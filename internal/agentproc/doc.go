// Package agentproc runs a sockmesh agent process for a test or the demo
// and reads what it says: Start runs the command (the built binary, or the
// test binary re-executed as `sockmesh`) in a sandbox network namespace and
// cgroup with a JSON log, and waits for its health listener; Log collects
// the log records and answers waits on them; WaitReady polls /readyz;
// Report asks for an introspection report (SIGUSR1); Stop ends the agent
// as the kubelet would (SIGTERM) and requires a clean exit.
//
// It knows the agent's log contract (cmd/sockmesh: slog JSON records,
// "listening" per listener, "introspection report" on SIGUSR1) and nothing
// of what the agent decides: tests check that themselves. It must not end
// a process it did not start, nor decide a test's outcome beyond failing
// when the agent cannot be started; product code must not import it.
package agentproc
