/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sockmesh.h: every struct, enum and constant that crosses between the eBPF
 * programs in sockmesh.c and the Go package datapath/. bpf2go generates the
 * Go side from here (-type), so nothing is mirrored by hand.
 *
 * Addresses are always 16 bytes: an IPv4 address is stored IPv4-mapped
 * (::ffff:a.b.c.d), so one key layout serves AF_INET sockets, AF_INET6 sockets
 * and AF_INET6 sockets talking IPv4 through mapped addresses.
 */
#ifndef SOCKMESH_H
#define SOCKMESH_H

#include <linux/types.h>

/* Family tags inside our structs (not AF_*: the same value on every arch). */
enum sm_family {
	SM_FAMILY_V4 = 4,
	SM_FAMILY_V6 = 6,
};

/*
 * sm_decision is the verdict of the connect hooks, also the index of the
 * per-CPU counter that counts it. Go names the values (datapath.Decision).
 */
enum sm_decision {
	SM_REDIRECTED = 0,    /* rewritten to the pod's proxy address */
	SM_SKIP_NOT_ENROLLED, /* the socket's netns is not enrolled */
	SM_SKIP_NO_SERVICE,   /* {address, port, protocol} is not captured */
	SM_SKIP_MARKED,	      /* the proxy's own socket (SO_MARK, in its netns) */
	SM_SKIP_PROXY_STALE,  /* fail-open service and the proxy heartbeat is stale */
	SM_SKIP_NO_PROXY,     /* fail-open service, no proxy listener in this family */
	SM_DENIED_NO_PROXY,   /* fail-closed service, no proxy listener in this family */
	SM_DECISION_MAX,
};

/* sm_service_flags are bits of sm_service.flags. */
enum sm_service_flags {
	/* Stop redirecting when the proxy heartbeat is stale. */
	SM_SERVICE_FAIL_OPEN = 1 << 0,
};

/* sm_service_key is a captured Service address: the key of sm_services. */
struct sm_service_key {
	__u32 addr[4]; /* network order, IPv4-mapped for IPv4 */
	__u16 port;    /* network order */
	__u8 proto;    /* IPPROTO_TCP */
	__u8 pad;
};

struct sm_service {
	enum sm_service_flags flags; /* a bit set */
};

/*
 * sm_pair_key names one (application netns, captured Service address) pair:
 * the key of sm_pair_counters.
 */
struct sm_pair_key {
	__u64 netns_cookie;	   /* netns of the connecting socket */
	struct sm_service_key svc; /* the captured address it dialled */
	__u32 pad;
};

/* sm_pair_counts counts one pair's connects by decision. */
struct sm_pair_counts {
	__u64 n[SM_DECISION_MAX]; /* indexed by enum sm_decision */
};

/*
 * sm_proxy is where an enrolled netns's connections go: the value of sm_netns,
 * keyed by the netns cookie of the application's socket.
 */
struct sm_proxy {
	/* Netns cookie of the proxy's listener: the node's root netns in
	 * node-IP mode, the pod's own netns in in-pod mode. Part of the key
	 * that hands the original destination to the accepted socket, because
	 * in in-pod mode every pod's 4-tuple can be 127.0.0.1:x -> 127.0.0.1:y. */
	__u64 netns_cookie;
	__u32 addr4;	/* network order */
	__u32 addr6[4]; /* network order */
	__u16 port4;	/* network order; 0: no IPv4 listener */
	__u16 port6;	/* network order; 0: no IPv6 listener */
};

/* sm_orig_dst is the destination the application passed to connect(). */
struct sm_orig_dst {
	__u32 addr[4]; /* network order, IPv4-mapped for IPv4 */
	__u16 port;    /* network order */
	__u8 family;   /* enum sm_family */
	__u8 pad;
};

/* sm_app_sock is the socket storage of a redirected application socket. */
struct sm_app_sock {
	struct sm_orig_dst orig;
	__u32 pad;
	__u64 proxy_netns_cookie;
};

/*
 * sm_handoff_key names one connection from the client side, so the proxy's
 * accepted socket (a different socket) can find the application socket's
 * original destination: the key of sm_handoff.
 */
struct sm_handoff_key {
	__u64 netns_cookie;   /* netns of the proxy's listener */
	__u32 client_addr[4]; /* network order, IPv4-mapped for IPv4 */
	__u32 proxy_addr[4];  /* network order, IPv4-mapped for IPv4 */
	__u16 client_port;    /* host order */
	__u16 proxy_port;     /* host order */
	__u32 pad;
};

/*
 * Acceleration (sm_accelerate): both sockets of a redirected connection sit
 * in sm_accel, and sm_msg hands each message straight to the other socket's
 * receive queue instead of through two TCP stacks.
 */
enum sm_side {
	SM_SIDE_APP = 1,
	SM_SIDE_PROXY = 2,
};

/* sm_accel_key names one socket in sm_accel: its connection, keyed as in
 * sm_handoff, and its side. */
struct sm_accel_key {
	struct sm_handoff_key conn;
	enum sm_side side;
	__u32 pad;
};

/* sm_accel_state: a socket's first message decides whether it redirects, and
 * a socket that stops redirecting never starts again (sm_msg says why). */
enum sm_accel_state {
	SM_ACCEL_UNDECIDED = 0,
	SM_ACCEL_REDIRECTING,
	SM_ACCEL_PLAIN,
};

/* sm_accel_sock is the socket storage of a socket in sm_accel. */
struct sm_accel_sock {
	struct sm_accel_key peer;
	enum sm_accel_state state;
	__u32 pad;
};

/* sm_accel_counts counts sockets (each once per field) since the map was
 * created: the value of sm_accel_counters. */
struct sm_accel_counts {
	__u64 joined;	    /* entered sm_accel */
	__u64 redirected;   /* its first message went to the peer directly */
	__u64 peer_missing; /* its first message found no peer: plain TCP */
	__u64 over_budget;  /* turned to TCP: SM_ACCEL_BUDGET unanswered or unread */
	__u64 peer_gone;    /* turned to TCP because the peer left */
};

/* sm_accel_conn is what both sockets of an accelerated connection share: the
 * value of sm_accel_conns, keyed by the connection. */
struct sm_accel_conn {
	__u32 unanswered[2]; /* by side - 1: bytes redirected since the other side sent */
};

/* At most this many bytes go to a peer that has not sent anything back: the
 * peer's receive queue is unbounded on this path (no TCP window), so a
 * stream or upload beyond it continues over TCP, which pushes back. */
#define SM_ACCEL_BUDGET (256 * 1024)

/*
 * sm_flow is the input of the connect decision; sm_decide_args wraps it for
 * the SEC("syscall") test shim, which Go runs with prog.Run on real maps.
 */
struct sm_flow {
	__u64 netns_cookie; /* netns of the connecting socket */
	__u64 now_ns;	    /* CLOCK_MONOTONIC, as bpf_ktime_get_ns */
	__u32 daddr[4];	    /* network order, IPv4-mapped for IPv4 */
	__u16 dport;	    /* network order */
	__u8 proto;	    /* IPPROTO_TCP */
	__u8 family;	    /* enum sm_family */
	__u32 mark;	    /* SO_MARK of the connecting socket */
};

struct sm_decide_args {
	struct sm_flow flow;	   /* in */
	enum sm_decision decision; /* out */
	__u16 proxy_port;	   /* out: network order, when SM_REDIRECTED */
	__u16 pad;
	__u32 proxy_addr[4]; /* out: network order, IPv4-mapped for IPv4 */
};

/*
 * The enums in the shim argument structs below are 4 bytes (C enums are int
 * sized) and keep the enum types in the object's BTF for bpf2go -type.
 *
 * sm_answer is what the getsockopt hook does with one call; sm_answer_args
 * wraps its inputs for the SEC("syscall") shim.
 */
enum sm_answer {
	SM_ANSWER_NONE = 0, /* leave the kernel's own answer untouched */
	SM_ANSWER_V4,	    /* write a struct sockaddr_in */
	SM_ANSWER_V6,	    /* write a struct sockaddr_in6 */
};

struct sm_answer_args {
	__s32 level;	       /* in */
	__s32 optname;	       /* in */
	__s32 buf_len;	       /* in: bytes the caller's buffer holds */
	enum sm_family family; /* in: of the stored destination, 0 when none */
	enum sm_answer answer; /* out */
};

#endif /* SOCKMESH_H */
