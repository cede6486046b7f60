// Command proxy benchmarks sockmesh's proxy doing TLS origination against the
// alternatives (../shared/BENCH.md): (a) the load generator speaks TLS to the
// backend itself, (b) sockmesh's proxy on each of its speeds for HTTP/1.x
// apps — pooled (the HTTP/1 fast path, the default), l4 (TLS wrapping of the
// app's bytes), l7 (net/http's server and Transport) — and (c) Debian's
// nginx configured fairly (proxy_pass https, verify on, upstream keepalive,
// session reuse), or with -versus haproxy Debian's HAProxy, which unlike
// nginx keeps HTTP/2 to the backend for h2c clients (alpn h2). Same backend, same load generators (wrk for HTTP/1.1,
// h2load for h2c), interleaved rounds; for each scenario it prints
// requests/s, p50/p99 latency, CPU per request (proxy, backend, load
// generator) and the share of the machine's CPU left idle, and the medians
// of the per-round ratios to a and to c with their min–max, then a summary
// of the default path against c.
//
// Traffic reaches each proxy as it does from a pod: every process runs in
// a throwaway network namespace, the enrolled pod; the load generator
// connects to a Service address and sockmesh's own eBPF programs, on a
// throwaway cgroup holding the load generator and the proxies, send the
// connection to the proxy on the namespace's loopback (in-pod mode) and
// answer its SO_ORIGINAL_DST. Every proxy runs throughout behind its own
// Service address; the pod's enrolment points at the proxy being
// measured. nginx (or HAProxy) is reached at its own address, as an app
// configured to use it would.
//
// Like with like: the backend offers TLS 1.3 with X25519 only, and the
// proxy's policy asks for X25519 only (-curves default lets Go offer
// X25519MLKEM768 too, which costs a key generation per handshake).
//
// Run as root:
//
//	go run ./test/bench/proxy [-rounds 5] [-duration 5s] [-paths pooled,l4,l7] [-only keep-alive] [-streams 10] [-gogc 100] [-accelerate] [-versus nginx|haproxy] [-backend go|nginx] [-cpuprofile DIR]
//	go run ./test/bench/proxy -idle 1000 -only "h2c client 64" -paths pooled   # memory per idle connection
//
// With the Go backend two upload rows follow: the app POSTs 64 KiB and
// gets 100 B back, over HTTP/1.1 (wrk -s) and h2c (h2load -d). nginx keeps
// request bodies up to 128 KiB in memory there (client_body_buffer_size;
// by default it writes those over 16 KiB to a file first); nginx as the
// backend serves files and refuses POSTs, so -backend nginx skips them.
// The session of 2026-11-27 (-rounds 3 -only upload), req/s, p99, proxy
// CPU/req ÷ nginx: HTTP/1.1 1.01, 1.04, 0.98; h2c 0.93, 1.08, 0.69 (the Go
// backend's HTTP/2 again: 157 against 98 µs per request in a 1-round run).
// Gathering the records of one relayed write into TLS into one system call
// (crypto/tls writes each of a Write's records on its own) measured no
// difference on the h2c upload row (6 rounds, A/B: req/s 0.89 against
// 0.95, proxy CPU/req 0.74 against 0.72) and was left out.
//
// HTTP/2 clients run twice: with one stream per connection (h2load -m 1,
// HTTP/2 used as HTTP/1.1 is, one request at a time) and with -streams
// concurrent streams per connection (10 by default), as gRPC channels and
// browsers multiplex. nginx keeps as many idle upstream connections per
// worker as requests can be in flight (at least 64, ../shared/BENCH.md's
// value): with 64 and 500 requests in flight, most of its requests paid a
// new TLS connection to the backend, and it made a quarter of the
// requests/s it makes with enough of them.
//
// The backend is Go's net/http (the echo backend) unless -backend nginx:
// Debian's nginx serving the same answers as files, on the same address,
// certificate and TLS settings. Go's HTTP/2 server costs it 1.5–1.75× the
// CPU per request of its HTTP/1.1; nginx's costs about the same, so with
// it the h2c rows measure the proxies rather than the backend's h2. On
// shared cores the backend's cost also dilutes the proxies' differences.
// The fourth session of 2026-11-26 (nothing else running), -rounds 5
// -duration 4s -paths pooled -backend nginx:
//
//	scenario                       req/s             p99               proxy CPU/req   all CPU/req   idle
//	keep-alive 100 B               0.80 (0.73–1.08)  1.10 (0.99–1.17)  1.29            1.18          8 % / 1 %
//	keep-alive 64 KiB              0.92 (0.74–0.99)  1.22 (1.01–1.52)  1.07            1.06          8 % / 5 %
//	conn-per-request 100 B         0.92 (0.85–0.99)  1.40 (1.21–1.67)  1.32            1.18          10 % / 15 %
//	h2c client 100 B               1.32 (1.26–1.71)  0.51 (0.45–0.66)  0.53            0.73          9 % / 5 %
//	h2c client 64 KiB              0.99 (0.94–1.12)  1.06 (0.99–1.13)  0.85            0.97          8 % / 2 %
//	h2c client 10 streams 100 B    2.49 (2.22–2.77)  0.35 (0.31–0.43)  0.20            0.37          8 % / 1 %
//	h2c client 10 streams 64 KiB   1.40 (1.29–1.43)  0.35 (0.14–0.38)  0.60            0.72          1 % / 0 %
//
// Behind nginx the backend spends about the same per request on the h2
// that sockmesh keeps as on the HTTP/1.1 that nginx sends it (20.3 and
// 21.3 µs, h2c 100 B), and sockmesh's relay of the app's h2 costs half of
// nginx's CPU: the one-stream h2c rows meet the target that they miss with
// the Go backend. The HTTP/1.1 rows go the other way: sockmesh's fast path
// spends 1.3× nginx's CPU per small request (33.7 against 26.2 µs; 18.7
// for the same request relayed as h2), which the Go backend's 50–60 µs of
// the shared cores hid. In a profile of that row 43 % of the proxy's CPU
// is system calls (fewer per request than nginx's, strace -c: 5.4 against
// 6) and the rest is spread thin; net/http's parsing of the request and
// of nginx's eight-field answer heads costs 1.6 and 3.4 µs alone (a
// microbenchmark, hot caches).
//
// Until the session of 2026-11-27 the relay wrote each TLS record (16 KiB)
// to the app as it read it; it now reads every record at hand first. A/B in
// one run against the old behaviour (-rounds 4 -paths pooled, Go backend),
// req/s and proxy CPU/req ÷ nginx: h2c 64 KiB 1.02, 0.72 against 0.82,
// 0.97; ten streams 64 KiB 1.10, 0.57 against 0.93, 0.76; 100 B rows
// unchanged; again with -rounds 6 -only "64 KiB": 0.91, 0.82 against 0.82,
// 1.00 and 1.19, 0.64 against 0.98, 0.73, while the fast path's keep-alive
// 64 KiB row, which the change does not touch, measured 0.88 against 0.92
// proxy CPU/req. The rows afterwards (-rounds 3 -duration 4s -paths
// pooled), req/s, p99, proxy CPU/req ÷ nginx, Go backend / nginx backend:
//
//	keep-alive 100 B               0.95, 0.89, 1.14  /  0.84, 1.21, 1.20
//	keep-alive 64 KiB              0.95, 0.93, 0.98  /  0.77, 1.29, 1.28
//	conn-per-request 100 B         0.90, 0.86, 1.19  /  0.84, 1.41, 1.36
//	h2c client 100 B               0.88, 1.04, 0.75  /  1.13, 0.69, 0.61
//	h2c client 64 KiB              0.72, 1.13, 0.95  /  0.95, 1.16, 0.79
//	h2c client 10 streams 100 B    1.24, 0.80, 0.29  /  3.00, 0.31, 0.14
//	h2c client 10 streams 64 KiB   1.15, 0.64, 0.52  /  1.76, 0.24, 0.43
//
// (with the Go backend the h2c 64 KiB row's proxy CPU matched nginx's
// while the backend spent 280 µs per request behind sockmesh's h2 against
// 162 behind nginx's HTTP/1.1. In the HTTP/1.1 64 KiB row behind nginx a
// fifth of sockmesh's CPU is crypto/tls's AES-GCM decryption, which is not
// what separates it from nginx: on this machine OpenSSL's is no faster —
// openssl speed -evp aes-128-gcm 3.4 GB/s at 16 KiB, Go's 3.2 (go test
// -bench AESGCM/Open-128-8192 crypto/cipher) — and per answer nginx made
// more system calls than sockmesh (perf trace -s: 8.9 against 7.8).)
//
// Since the second session of 2026-11-27 the fast path reads plain heads
// (userspace-proxy/httpproxy/h1head.go): a bodiless GET or HEAD, and an
// answer with one Content-Length, whose fields the proxy does not need go
// through as received instead of through net/http's parser and a rewrite
// of their header (BenchmarkHeads: nginx's answer head 0.75–0.96 µs and no
// allocation against 3.9–5.8 µs and 18; curl's request 0.83–0.95 µs
// against 2.9–3.1). A/B in one run against net/http's parser for every
// head (a temporary switch, since removed; -rounds 5 -duration 4s -only
// keep-alive), req/s and proxy CPU/req ÷ nginx: nginx backend, 100 B 0.94,
// 0.98 against 0.83, 1.25 and 64 KiB 0.98, 0.97 against 0.94, 1.07; Go
// backend, 100 B 1.09, 0.94 against 0.97, 1.13 and 64 KiB 1.02, 0.90
// against 1.02, 0.88 (the body's copy is most of that row). The rows
// afterwards (-rounds 3 -duration 4s -paths pooled), req/s, p99, proxy
// CPU/req ÷ nginx, Go backend / nginx backend:
//
//	keep-alive 100 B               0.92, 1.00, 1.05  /  0.94, 1.06, 1.00
//	keep-alive 64 KiB              1.11, 0.84, 0.89  /  0.86, 1.12, 1.02
//	conn-per-request 100 B         0.97, 0.88, 1.13  /  0.81, 1.31, 1.30
//	h2c client 100 B               0.83, 1.18, 0.78  /  1.30, 0.59, 0.55
//	h2c client 64 KiB              0.86, 0.98, 0.79  /  1.11, 0.92, 0.69
//	h2c client 10 streams 100 B    1.22, 0.75, 0.28  /  2.88, 0.37, 0.14
//	h2c client 10 streams 64 KiB   1.05, 0.71, 0.57  /  1.57, 0.34, 0.48
//	upload 64 KiB                  0.99, 1.10, 0.97
//	h2c client upload 64 KiB       0.88, 1.10, 0.71
//
// Between whole runs a row moves by ±15 % on this machine (keep-alive
// 100 B, Go backend: 0.99 and 0.92 in two runs of the same build), which
// is why changes are measured A/B within one run. With a connection per
// request sockmesh makes 14.5 system calls a connection against nginx's
// 11.3 (perf trace -s over a whole run, Go backend): Go's TCP_NODELAY and
// getsockname on accept, the TCP_CORK of the last answer and the pooled
// connection's check that nothing arrived (a read that finds nothing),
// against nginx's extra epoll_wait. Waiting for connections without a
// timer per worker (a janitor retiring idle workers instead) measured no
// difference (-rounds 5: req/s 0.82 against 0.83, proxy CPU/req 1.31
// against 1.33) and was left out.
//
// Measured on the 2-core machine of ../shared/BENCH.md with nothing else
// running, -rounds 11 -duration 4s -paths pooled, with the agent's GC heap
// floor (internal/gcfloor); medians of per-round ratios to nginx (min–max),
// and the median share of the machine left idle with sockmesh / with nginx
// (the fifth session of 2026-11-22):
//
//	scenario                 req/s             p99               proxy CPU/req   all CPU/req   idle
//	keep-alive 100 B         1.00 (0.90–1.11)  0.98 (0.76–1.07)  0.98            0.98          9 % / 6 %
//	keep-alive 64 KiB        1.10 (0.91–1.21)  0.92 (0.80–1.16)  0.85            0.93          7 % / 7 %
//	conn-per-request 100 B   0.91 (0.84–1.07)  0.91 (0.77–1.05)  1.19            1.05          18 % / 14 %
//	h2c client 100 B (L4)    0.84 (0.71–0.96)  1.15 (0.93–1.54)  0.88            1.14          14 % / 10 %
//	h2c client 64 KiB (L4)   0.79 (0.64–0.96)  1.02 (0.90–1.27)  1.14            1.28          8 % / 8 %
//
// The first session of 2026-11-26, the same flags and -rounds 9, with the
// multiplexed rows (nginx with 500 idle upstream connections per worker):
//
//	scenario                       req/s             p99               proxy CPU/req   all CPU/req   idle
//	keep-alive 100 B               0.91 (0.82–1.08)  1.05 (0.78–1.21)  1.11            1.08          7 % / 5 %
//	keep-alive 64 KiB              1.06 (0.82–1.27)  0.92 (0.72–1.16)  0.91            0.96          6 % / 7 %
//	conn-per-request 100 B         0.87 (0.71–0.96)  0.94 (0.83–1.20)  1.23            1.08          16 % / 12 %
//	h2c client 100 B               0.83 (0.72–0.97)  1.16 (1.03–1.40)  0.84            1.17          12 % / 9 %
//	h2c client 64 KiB              0.76 (0.66–0.87)  0.99 (0.87–1.09)  1.05            1.31          7 % / 7 %
//	h2c client 10 streams 100 B    1.23 (0.98–1.43)  0.71 (0.65–1.96)  0.34            0.80          2 % / 1 %
//	h2c client 10 streams 64 KiB   1.00 (0.82–1.28)  0.85 (0.64–1.12)  0.68            1.00          3 % / 2 %
//
// (the keep-alive 100 B row's 0.91 is this machine's noise, not a change:
// three interleaved pairs of 3-round runs of that row, a build of the
// fifth session's code against this one, gave 0.88, 1.02, 1.10 and 1.04,
// 1.01, 1.01; a 3-round run of the multiplexed rows the same hour: 1.08,
// p99 0.81 and 1.00, 0.88; one 8-second round of their 100 B row: 1.00,
// 0.95, proxy CPU/req 0.42). Multiplexed, the relay moves the frames of several
// streams in each read and write, and sockmesh's CPU per request falls to
// a third of nginx's (15.7 against 45.3 µs), which pays for the Go
// backend's dearer HTTP/2 (51.3 against 37.8 µs per request); one stream
// at a time, each system call of the relay carries one request, and it
// does not. The backend's HTTP/2 cost per request does not fall with
// multiplexing (a Go h2 server alone, h2load -c 10 -n 100000: 24 µs per
// request with -m 1, 27 with -m 10), nor is it its writes: it answers a
// small request in one write (strace -c), as its HTTP/1.1 server does.
//
// h2c clients lose on the backend's side, not the proxy's: sockmesh keeps
// HTTP/2 end to end (the app's h2 relayed over TLS), where nginx can only
// send HTTP/1.1 upstream, and the Go backend spends 60 µs per 100 B h2
// request against 41 µs per HTTP/1.1 one (223 against 162 µs for 64 KiB),
// while the proxies spent 40 and 48 µs. Against HAProxy, which keeps h2 to
// the backend too (-versus haproxy, the same day; its one backend
// connection multiplexes the clients' streams): h2c 100 B req/s 0.94
// (0.78–1.08), p99 1.09 in 11 rounds and 0.86, 1.21 in 7; h2c 64 KiB 1.42
// (1.25–1.61), p99 0.83, proxy CPU/req 0.56 (11 rounds); keep-alive 100 B
// 1.02, 0.97 and a connection per request 0.94, 0.98 (7 rounds). With 10
// streams a connection (2026-11-26, 3 rounds): 100 B 1.05 (1.00–1.12),
// p99 0.90, proxy CPU/req 0.66; 64 KiB 1.40 (1.33–1.52), 0.92, 0.51.
//
// With -accelerate (the agent's --accelerate: sk_msg hands the app's and
// the proxy's bytes to each other's socket, skipping loopback TCP), the
// fourth session's run, -rounds 11 -duration 4s -paths pooled -accelerate:
//
//	scenario                 req/s             p99               proxy CPU/req   all CPU/req   idle
//	keep-alive 100 B         1.20 (0.98–1.31)  0.90 (0.69–1.01)  0.81            0.82          11 % / 9 %
//	keep-alive 64 KiB        1.18 (0.98–1.32)  0.83 (0.69–0.96)  0.77            0.87          9 % / 9 %
//	conn-per-request 100 B   0.85 (0.77–0.95)  1.04 (0.85–1.20)  1.22            1.07          18 % / 14 %
//	h2c client 100 B (L4)    1.06 (0.89–1.15)  1.00 (0.90–1.17)  0.69            0.93          13 % / 10 %
//
// (each connection's two sockets join a sockhash, which a connection per
// request pays for), and the fifth session's, -only "h2c client"
// -accelerate: 100 B req/s 1.02 (0.89–1.11), p99 1.05, proxy CPU/req 0.71;
// 64 KiB 0.94 (0.80–1.12), 0.95, 0.81. Runs vary by about ±0.1.
//
// Memory per idle connection (-idle 1000 -paths pooled, 2026-11-26;
// resident memory of the proxy process, sockmesh's after a GC that returns
// free memory, each process fresh, one scenario a run):
//
//	connections, after one request each          sockmesh    nginx
//	keep-alive HTTP/1.1, 100 B answer             19.1 KiB    11.0 KiB
//	keep-alive HTTP/1.1, 64 KiB answer            21.6 KiB    15.6 KiB
//	h2c (relayed, TLS to the backend), 100 B      35.7 KiB    16.0 KiB
//	h2c (relayed, TLS to the backend), 64 KiB     54.5 KiB    20.1 KiB
//
// Before relays gave their copy buffers back while waiting, the h2c rows
// were 37.1 and 82.3 KiB (buffers that carried a 64 KiB answer are
// resident; fresh ones are not, though the Go heap, and so the soft
// memory limit, counts them either way). nginx ends h2 and reuses its
// pooled upstream connections; a relay keeps an upstream TLS connection
// per app connection, whose crypto/tls buffers are most of the rest.
//
// Relays that hold no copy buffer while they wait (relay's source,
// 2026-11-26: 146.6 to 18.7 KiB per idle relayed connection) cost nothing
// measurable on the rows that relay: -rounds 6 -duration 4s -only "h2c
// client", against a switch that held buffers as before (since removed):
// h2c 100 B proxy CPU 27.8 against 27.4 µs per request, req/s ÷ nginx
// 0.82 against 0.84; 64 KiB 122.5 against 123.8 µs, 0.83 against 0.81. A
// first version that waited with a peek after a read found nothing cost
// 8 % more proxy CPU on the 100 B row (30.9 against 28.6 µs) and was
// dropped.
//
// Tried and measured without gain (A/B in one run): the proxy with
// GOMAXPROCS=1 (7 rounds, keep-alive 100 B: req/s 0.87 against 1.00);
// coalescing the TLS records that had already arrived into one write to
// the app in the L4 relay (7 rounds, h2c 64 KiB: 0.79 against 0.78, proxy
// CPU/req 1.09 against 1.16). Without the GC floor (fourth session): 11
// rounds req/s 0.98, 1.07, 0.89, 0.94, p99 1.15, 0.94, 0.98, 0.99, proxy
// CPU/req 0.99, 0.85, 1.22, 0.83; 21 rounds (100 B only) req/s 1.00,
// 0.91, 0.90, p99 1.08, 1.00, 1.07. The floor A/B in one run (15 rounds,
// keep-alive 100 B, -paths pooled,pooled@SOCKMESH_GC_HEAP_FLOOR=0): req/s
// 1.07 / 1.05, p99 0.90 / 1.11, proxy CPU/req 0.91 / 0.95; GOGC=400
// instead pointed the same way twice (p99 0.90 / 0.99, 1.00 / 1.07). Two
// proxy processes with GOMAXPROCS=1 on one SO_REUSEPORT port (nginx's
// worker model) measured no gain (req/s 1.00 against 1.04, idle 10 %
// against 12 %).
//
// Until 2026-11-22 the bench captured with an iptables REDIRECT instead of
// the datapath (the numbers below). That charged sockmesh a NAT on every
// packet of the app's leg, and every process conntrack, which the product
// never does: nginx put behind the same REDIRECT (a patched build, 5
// rounds, keep-alive 100 B) made 0.93 of its own requests/s, p99 1.15,
// CPU per request 1.07. With the capture moved to the datapath, proxy CPU
// per keep-alive request went from 1.05–1.07 of nginx's to 0.99.
//
// With the iptables capture, -rounds 9 -duration 4s -paths pooled, load
// average 0.4 at the start:
//
//	scenario                 req/s             p99               proxy CPU/req   all CPU/req   idle
//	keep-alive 100 B         0.94 (0.84–1.10)  1.16 (0.65–1.46)  1.07            1.04          10 % / 8 %
//	keep-alive 64 KiB        1.05 (0.89–1.12)  0.95 (0.86–1.34)  0.88            0.95          7 % / 5 %
//	conn-per-request 100 B   0.90 (0.84–0.99)  0.93 (0.64–1.08)  1.19            1.06          19 % / 15 %
//	h2c client 100 B (L4)    0.89 (0.71–0.93)  1.05 (0.88–1.32)  0.88            1.08          13 % / 10 %
//
// A 9-round run half an hour earlier (load 2.5; the same code but for a
// shutdown before each close, measured neutral since): req/s 0.97, 1.06,
// 0.91, 0.81; p99 1.02, 0.95, 0.93, 1.15; proxy CPU/req 0.98, 0.88, 1.19,
// 0.91.
//
// A 7-round run the same hour, -paths pooled,pooled@GODEBUG=http2xconnect=1
// (the second without the schedtrace setting of proxy.RuntimeSettings):
// req/s 1.01, 1.08, 0.96, 0.87 with it, 1.04, 1.06, 0.84, 0.87 without;
// proxy CPU/req 0.98, 0.86, 1.17, 0.85 with it, 1.01, 0.88, 1.42, 0.85
// without. Before sockio's raw reads and writes and that setting (9
// rounds): req/s 0.88, 1.01, 0.85, 0.82; proxy CPU/req 1.15, 0.99, 1.32,
// 1.00.
//
// An earlier run with other builds sharing the cores (load average 3–5,
// -rounds 7, all three paths; the same code path measured twice in one run
// differed by up to 20 %, so read ratios to one decimal):
//
//	scenario                 default (pooled)            l4                  l7 (net/http)       proxy CPU/req pooled ÷ nginx
//	keep-alive 100 B         req/s 0.91 (0.74–1.03) p99 1.00   1.01 / 1.00         0.58 / 1.58         1.10
//	keep-alive 64 KiB        req/s 1.08 (0.94–1.22) p99 0.92   1.02 / 0.98         0.87 / 1.09         0.95
//	conn-per-request 100 B   req/s 0.88 (0.85–1.11) p99 0.95   0.25 / 4.41         0.71 / 1.46         1.30
//	h2c client 100 B         (L4 for every speed)              0.72 / 1.31                             1.10 (l4)
//
// and on a busier run (load average 7–11; answer buffer then 64 KiB, back
// to 32 KiB since: one write fewer per 64 KiB answer was not measurable,
// and a streamed answer holds its buffer): keep-alive 100 B 1.15 / p99
// 0.43, 64 KiB 1.03 / 0.50, connection per request 1.17 / 0.36, h2c 0.80 /
// 1.28, with proxy CPU per request 1.08, 0.92, 1.24 and 1.05 of nginx's.
// Throughput on these 2 shared cores follows the CPU per request of proxy,
// backend and load generator together ("all CPU/req" in the summary), and
// the time the cores sit idle waiting on wakeups: with keep-alive, at
// about equal CPU per request, they idled 10-15 % of the run with sockmesh
// and 8-10 % with nginx (the idle column; a likely cause: nginx's
// two workers each wait in epoll_wait, where the Go runtime keeps one
// thread in epoll and parks the others). What is left, from profiles of the pooled path: about
// 60 % of its CPU is in system calls (loopback writes and the FIN run the
// receiver's TCP input too), which nginx pays alike. Go's own part was
// mostly the runtime's sysmon thread (with a connection per request, 42 %
// of the proxy's context switches before proxy.RuntimeSettings, while
// system calls marked as such woke it from its deep sleep: sockio makes
// the proxy's reads and writes raw); what remains is waking spinning
// threads for each readied goroutine (1.0 context switches per
// connection against nginx's 0.9; per keep-alive request 0.2 against
// 0.3), net's accept, TCP_NODELAY and close per connection, and a
// speculative read that finds nothing before each upstream answer
// (writing the request from inside that read's poller callback instead,
// to skip it, measured no gain in a 5-round A/B: proxy CPU/req 1.00
// against 1.01 with keep-alive, 1.18 against 1.23 per connection). With
// the datapath capture and a connection per request (perf record -g and
// strace -c on both proxies), the runtime's scheduler parking and waking
// threads took 12 % of the proxy's CPU, while the system calls per
// connection were about equal: accept4, 2 epoll_ctl, 2 to 3 reads, 2
// writes and close on both; getsockname, TCP_NODELAY, SO_ORIGINAL_DST and
// TCP_CORK on sockmesh's side, epoll_wait and getsockopt on nginx's. The
// GC took 1–2 % of the CPU, but with the proxy's few MiB alive it ran many
// times a second, lengthening the tail (the heap floor above). h2c
// clients lose on the backend's side: relayed as h2 over TLS (L4) the Go
// backend spends 1.5× the CPU per request of the HTTP/1.1 that nginx
// sends it; terminating h2 in net/http (-paths http11) costs the proxy
// 2.5× nginx's CPU instead. Before the pooled path, the default for
// HTTP/1.x to TLS backends was l4 (0.16–0.26 of nginx with a connection
// per request).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	role := flag.String("role", "", "internal: backend | proxy | idle")
	rounds := flag.Int("rounds", 5, "interleaved rounds")
	duration := flag.Duration("duration", 0, "duration of one load run (default 5s)")
	conns := flag.Int("conns", 50, "client connections")
	streams := flag.Int("streams", 10, "concurrent streams per connection in the multiplexed h2c scenarios (h2load -m)")
	dir := flag.String("dir", "", "internal: working directory with certificates")
	mode := flag.String("mode", "", "internal: proxy speed for HTTP/1.1 over TLS (pooled | l4 | l7 | http11: pooled, with the backend's protocol HTTP11)")
	listen := flag.String("listen", "", "internal: proxy listen address")
	vip := flag.String("vip", "", "internal: the Service address the proxy captures")
	paths := flag.String("paths", "pooled,l4,l7", "sockmesh speeds to measure, comma-separated; a speed may add environment variables for its proxy: pooled@GOGC=400")
	only := flag.String("only", "", "run only scenarios whose name contains this")
	gogc := flag.String("gogc", "", "GOGC for the proxies (empty: Go's default, 100)")
	procs := flag.String("gomaxprocs", "", "GOMAXPROCS for the proxies (empty: Go's default, the CPUs)")
	curves := flag.String("curves", "x25519", "key exchanges the proxy offers: x25519 | default")
	accelerate := flag.Bool("accelerate", false, "accelerate the app-to-proxy leg with sk_msg, as the agent's --accelerate does")
	versus := flag.String("versus", "nginx", "the proxy sockmesh is compared with (target c): nginx | haproxy (keeps h2 to the backend for h2c clients)")
	backend := flag.String("backend", "go", "the backend behind every target: go (net/http, whose HTTP/2 costs it 1.5–1.75× its HTTP/1.1) | nginx")
	profile := flag.String("cpuprofile", "", "write each proxy's CPU profile over the whole run to this directory (<n>-<speed>.pprof)")
	idle := flag.Int("idle", 0, "instead of load, the memory each proxy keeps per idle connection, with this many connections (one scenario a run: -only keep-alive or -only h2c)")
	url := flag.String("url", "", "internal: the idle client's URL")
	n := flag.Int("n", 0, "internal: the idle client's connections")
	h2c := flag.Bool("h2c", false, "internal: the idle client speaks h2c")
	flag.Parse()
	var err error
	switch *role {
	case "backend":
		err = runBackend(*dir)
	case "proxy":
		err = runProxy(*dir, *mode, *listen, *vip, *curves, *profile)
	case "idle":
		err = runIdleClient(*url, *n, *h2c)
	case "":
		if *streams < 1 {
			err = fmt.Errorf("-streams %d: want at least 1", *streams)
			break
		}
		if os.Geteuid() != 0 {
			err = fmt.Errorf("needs root (network namespace, cgroup, eBPF)")
			break
		}
		err = runBench(benchConfig{rounds: *rounds, duration: *duration, conns: *conns, streams: *streams, only: *only,
			paths: strings.Split(*paths, ","), gogc: *gogc, gomaxprocs: *procs, curves: *curves, profile: *profile, accelerate: *accelerate, versus: *versus, backend: *backend, command: commandLine(),
			idle: *idle})
	default:
		err = fmt.Errorf("unknown role %q", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// commandLine is how this run was started, for the report's header.
func commandLine() string {
	return strings.TrimSpace("go run ./test/bench/proxy " + strings.Join(os.Args[1:], " "))
}
