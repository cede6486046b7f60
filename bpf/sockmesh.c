// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sockmesh.c: transparent capture of Service connections for the node proxy.
 *
 *   cgroup/connect4|6      enrolled netns + captured {addr, port, proto}
 *                          -> rewrite the destination to the pod's proxy
 *                          address; remember the original in socket storage.
 *   sockops                the app socket's original destination -> a map keyed
 *                          by the 4-tuple -> the proxy's accepted socket storage.
 *   cgroup/getsockopt      SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST on the proxy's
 *                          accepted socket answers from that storage.
 *   cgroup/getpeername4|6  the application still sees the Service address.
 *   sk_msg (optional)      on both sockets of a redirected connection, kept in
 *                          a sockhash by sockops: each message goes straight
 *                          to the other socket's receive queue.
 *
 * One compilation unit, so every hook shares the same maps. Each decision is a
 * static __always_inline function; SEC("syscall") shims at the end run them
 * from Go with prog.Run (BPF_PROG_TEST_RUN cannot run sock_addr, sockops or
 * sockopt programs). Kernel needs: bpf_link for cgroups 5.7,
 * bpf_get_netns_cookie in sock_addr 5.7 and in sockops 5.15, getpeername
 * hooks 5.8, bpf_sk_storage_get in sockops 5.10; MPTCP apps' getpeername
 * bpf_skc_to_mptcp_sock 5.19 (skipped before); with acceleration, the
 * sk_msg link on a sockhash 6.10 (sk_psock.msg_tot_len came in 6.8, so
 * datapath loads sm_msg only then).
 */
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "sockmesh.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* From <linux/netfilter_ipv4.h> and <linux/netfilter_ipv6/ip6_tables.h>,
 * whose userspace includes do not build for the bpf target. */
#define SO_ORIGINAL_DST	     80
#define IP6T_SO_ORIGINAL_DST 80
/* SOL_IP and SOL_IPV6 equal the protocol numbers (libc's bits/socket.h). */
#define SOL_IP	 IPPROTO_IP
#define SOL_IPV6 IPPROTO_IPV6
/* From the kernel-internal <linux/net.h> and <linux/socket.h>; no uapi
 * header defines them. */
#define SOCK_STREAM 1
#define AF_INET	    2
#define AF_INET6    10

/* cgroup sock_addr and sockopt programs: 1 lets the syscall continue, 0 fails
 * it with EPERM. */
#define SM_ALLOW  1
#define SM_REJECT 0

/*
 * Set at load time by datapath.Open (never #ifdef: one object serves every
 * node). A restarted agent loads fresh programs with its own values and
 * swaps them into the pinned links, and one that takes the datapath back
 * from a newer agent swaps its own back in: the values the links run with
 * are always those of the agent whose programs run, its proxy's mark and
 * netns among them.
 */
volatile const __u32 sm_proxy_mark = 0;		  /* SO_MARK of the proxy's sockets */
volatile const __u64 sm_proxy_netns = 0;	  /* netns cookie the proxy dials from */
volatile const __u64 sm_heartbeat_max_age_ns = 0; /* fail-open staleness threshold */
volatile const __u32 sm_accelerate = 0;		  /* 1: sockhash/sk_msg on the app<->proxy leg */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sm_service_key);
	__type(value, struct sm_service);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_services SEC(".maps");

/* Enrolled network namespaces, keyed by netns cookie. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct sm_proxy);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_netns SEC(".maps");

/* CLOCK_MONOTONIC nanoseconds of the proxy's last heartbeat. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_heartbeat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SM_DECISION_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_counters SEC(".maps");

/*
 * Per-pair decision counters, for `sockmeshctl explain`: connects from an
 * enrolled netns to a captured address only, so they cost nothing on the
 * node's other connects. LRU: pairs of pods and Services long gone age out.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sm_pair_key);
	__type(value, struct sm_pair_counts);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_pair_counters SEC(".maps");

/* The original destination of each redirected application socket. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sm_app_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_app_sk SEC(".maps");

/* The original destination of each accepted proxy socket. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sm_orig_dst);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_proxy_sk SEC(".maps");

/*
 * In-flight handoffs from an application socket (written when its SYN leaves)
 * to the proxy's accepted socket (read and deleted when that socket is
 * established). LRU, so handoffs whose proxy never answered age out even if
 * the close hook missed them.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sm_handoff_key);
	__type(value, struct sm_orig_dst);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_handoff SEC(".maps");

static __always_inline void sm_count(enum sm_decision d)
{
	__u32 key = d;
	__u64 *n = bpf_map_lookup_elem(&sm_counters, &key);

	if (n)
		*n += 1; /* per-CPU slot: no atomics needed */
}

/*
 * sm_count_pair counts d for the flow's (netns, Service address) pair when
 * the netns is enrolled and the address captured: the decisions an operator
 * asks about for one pod and one Service.
 */
static __always_inline void sm_count_pair(const struct sm_flow *f, enum sm_decision d)
{
	if (d == SM_SKIP_NOT_ENROLLED || d == SM_SKIP_NO_SERVICE || d >= SM_DECISION_MAX)
		return;
	struct sm_pair_key k = {
		.netns_cookie = f->netns_cookie,
		.svc = {
			.addr = { f->daddr[0], f->daddr[1], f->daddr[2], f->daddr[3] },
			.port = f->dport,
			.proto = f->proto,
		},
	};
	struct sm_pair_counts *c = bpf_map_lookup_elem(&sm_pair_counters, &k);
	if (!c) {
		struct sm_pair_counts zero = {};
		/* NOEXIST: a connect on another CPU may have made it meanwhile. */
		bpf_map_update_elem(&sm_pair_counters, &k, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&sm_pair_counters, &k);
		if (!c)
			return;
	}
	/* Shared by every CPU, unlike sm_counters' per-CPU slots. */
	__sync_fetch_and_add(&c->n[d], 1);
}

static __always_inline void sm_map_v4(__u32 out[4], __u32 addr4)
{
	out[0] = 0;
	out[1] = 0;
	out[2] = bpf_htonl(0x0000ffff);
	out[3] = addr4;
}

/* sm_proxy_stale: has the proxy missed its heartbeat for longer than the
 * threshold? A proxy that never beat is stale. */
static __always_inline bool sm_proxy_stale(__u64 now_ns)
{
	__u32 key = 0;
	__u64 *beat = bpf_map_lookup_elem(&sm_heartbeat, &key);

	if (!beat || *beat == 0)
		return true;
	return now_ns > *beat && now_ns - *beat > sm_heartbeat_max_age_ns;
}

/* sm_proxy_for writes the proxy address for the flow's family; false when the
 * enrolment has no listener in that family. */
static __always_inline bool sm_proxy_for(const struct sm_proxy *p, __u8 family, __u32 addr[4],
					 __u16 *port)
{
	if (family == SM_FAMILY_V4) {
		if (p->port4 == 0)
			return false;
		sm_map_v4(addr, p->addr4);
		*port = p->port4;
		return true;
	}
	if (p->port6 == 0)
		return false;
	addr[0] = p->addr6[0];
	addr[1] = p->addr6[1];
	addr[2] = p->addr6[2];
	addr[3] = p->addr6[3];
	*port = p->port6;
	return true;
}

/*
 * sm_proxy_own: is this the proxy's own upstream socket? It carries the
 * proxy's mark and lives in the netns the proxy dials from (the agent's,
 * where the agent loaded these programs). The mark alone proves nothing:
 * since Linux 5.17 CAP_NET_RAW, which container runtimes grant pods by
 * default, is enough to set SO_MARK, and a pod wearing the mark would
 * connect past its proxy to a fail-closed service.
 */
static __always_inline bool sm_proxy_own(const struct sm_flow *f)
{
	return sm_proxy_mark != 0 && f->mark == sm_proxy_mark && f->netns_cookie == sm_proxy_netns;
}

/*
 * sm_decide is the whole connect decision, in the order that makes each
 * counter answer one question: is the pod enrolled, is the destination
 * captured, is this the proxy's own socket, may a fail-open service bypass a
 * stale proxy, is there a listener for this family.
 */
static __always_inline enum sm_decision sm_decide(const struct sm_flow *f, __u32 proxy_addr[4],
						  __u16 *proxy_port, __u64 *proxy_netns)
{
	const struct sm_proxy *p = bpf_map_lookup_elem(&sm_netns, &f->netns_cookie);
	if (!p)
		return SM_SKIP_NOT_ENROLLED;

	struct sm_service_key key = {
		.addr = { f->daddr[0], f->daddr[1], f->daddr[2], f->daddr[3] },
		.port = f->dport,
		.proto = f->proto,
	};
	const struct sm_service *svc = bpf_map_lookup_elem(&sm_services, &key);
	if (!svc)
		return SM_SKIP_NO_SERVICE;

	if (sm_proxy_own(f))
		return SM_SKIP_MARKED;

	bool fail_open = svc->flags & SM_SERVICE_FAIL_OPEN;
	if (fail_open && sm_proxy_stale(f->now_ns))
		return SM_SKIP_PROXY_STALE;

	if (!sm_proxy_for(p, f->family, proxy_addr, proxy_port))
		return fail_open ? SM_SKIP_NO_PROXY : SM_DENIED_NO_PROXY;
	*proxy_netns = p->netns_cookie;
	return SM_REDIRECTED;
}

/* Only whether the kernel has it matters (sm_mptcp_parent). */
struct mptcp_sock___sm {
	int sm_unused;
};

/*
 * sm_mptcp_parent is the MPTCP socket of sk when sk is an MPTCP subflow, else
 * NULL. An application's IPPROTO_MPTCP socket connects through a TCP
 * subflow, the socket connect4/6 see, while its getpeername asks the MPTCP
 * socket. bpf_skc_to_mptcp_sock came in Linux 5.19, and its answer's type
 * exists only with CONFIG_MPTCP: without either this is NULL, and the
 * verifier never sees the call.
 */
static __always_inline void *sm_mptcp_parent(struct bpf_sock *sk)
{
	if (!bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_skc_to_mptcp_sock) ||
	    !bpf_core_type_exists(struct mptcp_sock___sm))
		return NULL;
	return bpf_skc_to_mptcp_sock(sk);
}

/* sm_store sets sk's original destination record to v. */
static __always_inline void sm_store(void *sk, const struct sm_app_sock *v)
{
	struct sm_app_sock *s = bpf_sk_storage_get(&sm_app_sk, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (s)
		*s = *v;
}

/* sm_remember stores the original destination in the application socket,
 * and in its MPTCP socket when it is an MPTCP subflow: sockops reads the
 * subflow's, getpeername the MPTCP socket's. */
static __always_inline void sm_remember(struct bpf_sock *sk, const struct sm_flow *f,
					__u64 proxy_netns)
{
	struct sm_app_sock s = {
		.orig = {
			.addr = { f->daddr[0], f->daddr[1], f->daddr[2], f->daddr[3] },
			.port = f->dport,
			.family = f->family,
		},
		.proxy_netns_cookie = proxy_netns,
	};
	sm_store(sk, &s);
	void *parent = sm_mptcp_parent(sk);
	if (parent)
		sm_store(parent, &s);
}

/* sm_forget drops what sm_remember stored. */
static __always_inline void sm_forget(struct bpf_sock *sk)
{
	bpf_sk_storage_delete(&sm_app_sk, sk);
	void *parent = sm_mptcp_parent(sk);
	if (parent)
		bpf_sk_storage_delete(&sm_app_sk, parent);
}

static __always_inline bool sm_is_tcp(const struct bpf_sock_addr *ctx)
{
	return ctx->type == SOCK_STREAM && ctx->protocol == IPPROTO_TCP;
}

/*
 * sm_connect decides a flow, counts the decision and, for a redirect,
 * remembers the original destination in the socket and writes the proxy
 * address. The caller rewrites the destination when it returns
 * SM_REDIRECTED and fails connect() for SM_DENIED_NO_PROXY.
 */
static __always_inline enum sm_decision sm_connect(struct bpf_sock_addr *ctx,
						   const struct sm_flow *f, __u32 proxy_addr[4],
						   __u16 *proxy_port)
{
	__u64 proxy_netns = 0;
	enum sm_decision d = sm_decide(f, proxy_addr, proxy_port, &proxy_netns);

	sm_count(d);
	sm_count_pair(f, d);
	if (d == SM_REDIRECTED)
		sm_remember(ctx->sk, f, proxy_netns);
	else
		/* A socket may connect() again after a redirected connect()
		 * failed (no proxy listening): the original destination it
		 * kept would show in getpeername and be published as a
		 * handoff for a connection that is not redirected. */
		sm_forget(ctx->sk);
	return d;
}

SEC("cgroup/connect4")
int sm_connect4(struct bpf_sock_addr *ctx)
{
	if (!sm_is_tcp(ctx))
		return SM_ALLOW;

	struct sm_flow f = {
		.netns_cookie = bpf_get_netns_cookie(ctx),
		.now_ns = bpf_ktime_get_ns(),
		.dport = (__u16)ctx->user_port,
		.proto = IPPROTO_TCP,
		.family = SM_FAMILY_V4,
		.mark = ctx->sk->mark,
	};
	sm_map_v4(f.daddr, ctx->user_ip4);

	/* Initialised: clang otherwise moves the unset values around on the
	 * not-redirected paths, and the verifier rejects reading them. */
	__u32 proxy_addr[4] = {};
	__u16 proxy_port = 0;
	switch (sm_connect(ctx, &f, proxy_addr, &proxy_port)) {
	case SM_REDIRECTED:
		/* volatile: clang may merge adjacent ctx stores into one 8-byte
		 * store, which the verifier rejects (invalid bpf_context access). */
		*(volatile __u32 *)&ctx->user_ip4 = proxy_addr[3];
		*(volatile __u32 *)&ctx->user_port = proxy_port;
		return SM_ALLOW;
	case SM_DENIED_NO_PROXY:
		return SM_REJECT;
	default:
		return SM_ALLOW;
	}
}

SEC("cgroup/connect6")
int sm_connect6(struct bpf_sock_addr *ctx)
{
	if (!sm_is_tcp(ctx))
		return SM_ALLOW;

	struct sm_flow f = {
		.netns_cookie = bpf_get_netns_cookie(ctx),
		.now_ns = bpf_ktime_get_ns(),
		.daddr = { ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3] },
		.dport = (__u16)ctx->user_port,
		.proto = IPPROTO_TCP,
		.family = SM_FAMILY_V6,
		.mark = ctx->sk->mark,
	};
	/* An AF_INET6 socket dialling ::ffff:a.b.c.d talks IPv4; the kernel
	 * does not run connect4 for it, so look it up as IPv4 here. */
	if (f.daddr[0] == 0 && f.daddr[1] == 0 && f.daddr[2] == bpf_htonl(0x0000ffff))
		f.family = SM_FAMILY_V4;

	__u32 proxy_addr[4] = {};
	__u16 proxy_port = 0;
	switch (sm_connect(ctx, &f, proxy_addr, &proxy_port)) {
	case SM_REDIRECTED:
		*(volatile __u32 *)&ctx->user_ip6[0] = proxy_addr[0];
		*(volatile __u32 *)&ctx->user_ip6[1] = proxy_addr[1];
		*(volatile __u32 *)&ctx->user_ip6[2] = proxy_addr[2];
		*(volatile __u32 *)&ctx->user_ip6[3] = proxy_addr[3];
		*(volatile __u32 *)&ctx->user_port = proxy_port;
		return SM_ALLOW;
	case SM_DENIED_NO_PROXY:
		return SM_REJECT;
	default:
		return SM_ALLOW;
	}
}

/* The application asked for its peer: show the Service address it dialled,
 * not the proxy it reached. */
SEC("cgroup/getpeername4")
int sm_getpeername4(struct bpf_sock_addr *ctx)
{
	struct sm_app_sock *s = bpf_sk_storage_get(&sm_app_sk, ctx->sk, 0, 0);

	if (!s || s->orig.family != SM_FAMILY_V4)
		return SM_ALLOW;
	*(volatile __u32 *)&ctx->user_ip4 = s->orig.addr[3];
	*(volatile __u32 *)&ctx->user_port = s->orig.port;
	return SM_ALLOW;
}

SEC("cgroup/getpeername6")
int sm_getpeername6(struct bpf_sock_addr *ctx)
{
	struct sm_app_sock *s = bpf_sk_storage_get(&sm_app_sk, ctx->sk, 0, 0);

	if (!s)
		return SM_ALLOW;
	/* An IPv4 original on an AF_INET6 socket is already stored mapped. */
	*(volatile __u32 *)&ctx->user_ip6[0] = s->orig.addr[0];
	*(volatile __u32 *)&ctx->user_ip6[1] = s->orig.addr[1];
	*(volatile __u32 *)&ctx->user_ip6[2] = s->orig.addr[2];
	*(volatile __u32 *)&ctx->user_ip6[3] = s->orig.addr[3];
	*(volatile __u32 *)&ctx->user_port = s->orig.port;
	return SM_ALLOW;
}

/*
 * Both ends of each redirected connection (when sm_accelerate is set), so the
 * sk_msg program can hand one end's bytes straight to the other's receive
 * queue. Sockets leave the map when they close.
 */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sm_accel_key);
	__type(value, __u64);
	/* Pinned: dropping a socket from the map drops what its receive
	 * queue holds from the peer, so the map must outlive the agent. */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_accel SEC(".maps");

/* Per accelerated connection; the application socket's close deletes it,
 * LRU in case that hook is missed. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sm_handoff_key);
	__type(value, struct sm_accel_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_accel_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sm_accel_counts);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_accel_counters SEC(".maps");

/* Where each socket in sm_accel sends, and whether it does. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sm_accel_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sm_accel_sk SEC(".maps");

/* sm_ctx_read loads a context field right here. Plain loads let clang
 * compute ctx+offset in one branch and dereference it in another, which the
 * verifier rejects (dereference of modified ctx ptr). */
#define sm_ctx_read(field) (*(volatile typeof(field) *)&(field))

/* sm_tuple reads a sockops socket's addresses, IPv4-mapped for IPv4 (also
 * for an AF_INET6 socket talking IPv4, whose ip6 fields are mapped already),
 * and its ports in host order. */
static __always_inline void sm_tuple(const struct bpf_sock_ops *skops, __u32 local[4],
				     __u32 remote[4], __u16 *local_port, __u16 *remote_port)
{
	if (sm_ctx_read(skops->family) == AF_INET) {
		sm_map_v4(local, sm_ctx_read(skops->local_ip4));
		sm_map_v4(remote, sm_ctx_read(skops->remote_ip4));
	} else {
		local[0] = sm_ctx_read(skops->local_ip6[0]);
		local[1] = sm_ctx_read(skops->local_ip6[1]);
		local[2] = sm_ctx_read(skops->local_ip6[2]);
		local[3] = sm_ctx_read(skops->local_ip6[3]);
		remote[0] = sm_ctx_read(skops->remote_ip6[0]);
		remote[1] = sm_ctx_read(skops->remote_ip6[1]);
		remote[2] = sm_ctx_read(skops->remote_ip6[2]);
		remote[3] = sm_ctx_read(skops->remote_ip6[3]);
	}
	*local_port = sm_ctx_read(skops->local_port);
	/* remote_port holds the network-order port in its upper 16 bits on
	 * little-endian (include/uapi/linux/bpf.h, bpf_sock_ops). */
	*remote_port = bpf_ntohl(sm_ctx_read(skops->remote_port));
}

/* The application socket's key: it is the client, the proxy is its peer. */
static __always_inline void sm_active_key(const struct bpf_sock_ops *skops, __u64 proxy_netns,
					  struct sm_handoff_key *k)
{
	k->netns_cookie = proxy_netns;
	sm_tuple(skops, k->client_addr, k->proxy_addr, &k->client_port, &k->proxy_port);
}

/* The accepted socket's key: it is the proxy, the client is its peer. */
static __always_inline void sm_passive_key(struct bpf_sock_ops *skops, struct sm_handoff_key *k)
{
	k->netns_cookie = bpf_get_netns_cookie(skops);
	sm_tuple(skops, k->proxy_addr, k->client_addr, &k->proxy_port, &k->client_port);
}

static __always_inline struct sm_accel_counts *sm_accel_counts(void)
{
	__u32 key = 0;
	return bpf_map_lookup_elem(&sm_accel_counters, &key);
}

#define sm_accel_count(field)                                   \
	do {                                                    \
		struct sm_accel_counts *c_ = sm_accel_counts(); \
		if (c_)                                         \
			c_->field++;                            \
	} while (0)

/* sm_accel_offer records where a socket of connection k sends (the peer
 * side); sm_accel_join then puts it into sm_accel as the other side. */
static __always_inline void sm_accel_offer(struct bpf_sock *sk, const struct sm_handoff_key *k,
					   __u32 peer_side)
{
	if (!sm_accelerate)
		return;
	struct sm_accel_sock *a =
		bpf_sk_storage_get(&sm_accel_sk, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!a)
		return;
	a->peer.conn = *k;
	a->peer.side = peer_side;
	a->state = SM_ACCEL_UNDECIDED;
	if (peer_side == SM_SIDE_PROXY) {
		struct sm_accel_conn c = {};
		bpf_map_update_elem(&sm_accel_conns, k, &c, BPF_ANY);
	}
}

static __always_inline void sm_accel_join(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sm_accelerate || !sk)
		return;
	struct sm_accel_sock *a = bpf_sk_storage_get(&sm_accel_sk, sk, 0, 0);
	if (!a)
		return;
	struct sm_accel_key self = {
		.conn = a->peer.conn,
		.side = a->peer.side == SM_SIDE_APP ? SM_SIDE_PROXY : SM_SIDE_APP,
	};
	if (bpf_sock_hash_update(skops, &sm_accel, &self, BPF_ANY))
		a->state = SM_ACCEL_PLAIN;
	else
		sm_accel_count(joined);
}

/*
 * The application socket's SYN is about to leave (its source port is now
 * bound): publish its original destination under the connection's 4-tuple.
 * The proxy's side of the connection is made from that SYN at the earliest
 * (a listener that takes TCP Fast Open makes it before its SYN-ACK), so the
 * entry is always there first. A Fast Open connect, by sendto(MSG_FASTOPEN)
 * or after TCP_FASTOPEN_CONNECT, runs connect4/6 and comes here as
 * connect() does.
 */
static __always_inline void sm_on_connect(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sm_app_sock *s = bpf_sk_storage_get(&sm_app_sk, sk, 0, 0);
	if (!s)
		return;

	struct sm_handoff_key k = {};
	sm_active_key(skops, s->proxy_netns_cookie, &k);
	bpf_map_update_elem(&sm_handoff, &k, &s->orig, BPF_ANY);
	sm_accel_offer(sk, &k, SM_SIDE_PROXY);
	/* Delete the entry if this socket closes before the proxy took it
	 * (proxy down, connection refused). The helper replaces the socket's
	 * flags: keep those another sockops program on the cgroup set. */
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
}

/* The application socket closed: drop a handoff the proxy never took, so a
 * later connection that reuses the 4-tuple cannot inherit it. */
static __always_inline void sm_on_state(struct bpf_sock_ops *skops)
{
	if (skops->args[1] != BPF_TCP_CLOSE)
		return;
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sm_app_sock *s = bpf_sk_storage_get(&sm_app_sk, sk, 0, 0);
	if (!s)
		return;

	struct sm_handoff_key k = {};
	sm_active_key(skops, s->proxy_netns_cookie, &k);
	bpf_map_delete_elem(&sm_handoff, &k);
	bpf_map_delete_elem(&sm_accel_conns, &k);
}

/* A proxy listener accepted a connection: if it is a redirected one, move the
 * original destination into the accepted socket's storage. The kernel runs
 * this before accept() can hand the socket to the proxy (the child socket
 * stays locked until it is established). */
static __always_inline void sm_on_passive(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;

	struct sm_handoff_key k = {};
	sm_passive_key(skops, &k);
	struct sm_orig_dst *orig = bpf_map_lookup_elem(&sm_handoff, &k);
	if (!orig)
		return;

	struct sm_orig_dst *dst =
		bpf_sk_storage_get(&sm_proxy_sk, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (dst)
		*dst = *orig;
	bpf_map_delete_elem(&sm_handoff, &k);
	sm_accel_offer(sk, &k, SM_SIDE_APP);
	sm_accel_join(skops);
}

SEC("sockops")
int sm_sockops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		sm_on_connect(skops);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		sm_on_state(skops);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		sm_on_passive(skops);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		sm_accel_join(skops);
		break;
	}
	return 1;
}

/*
 * The kernel's struct sock and struct sk_psock, only the fields read here;
 * CO-RE finds their offsets in the running kernel's BTF.
 */
struct sock___sm {
	void *sk_user_data;
} __attribute__((preserve_access_index));
struct sk_psock___sm {
	__u32 msg_tot_len; /* bytes in the ingress queue, not yet read */
} __attribute__((preserve_access_index));

/* The low bits of sk_user_data are flags (SK_USER_DATA_PTRMASK). */
#define SM_SK_USER_DATA_FLAGS 7UL

/*
 * sm_accel_unread is how many bytes the peer handed to sk that sk's owner
 * has not read yet: its psock's ingress queue (what FIONREAD reports, since
 * Linux 6.8).
 */
static __always_inline __u32 sm_accel_unread(struct bpf_sock *sk)
{
	struct sock___sm *s = (void *)bpf_skc_to_tcp_sock(sk);
	if (!s)
		return 0;
	unsigned long data = (unsigned long)BPF_CORE_READ(s, sk_user_data);
	struct sk_psock___sm *psock = (void *)(data & ~SM_SK_USER_DATA_FLAGS);
	if (!psock)
		return 0;
	return BPF_CORE_READ(psock, msg_tot_len);
}

/*
 * sk_msg on sockets in sm_accel: put the bytes straight into the peer's
 * receive queue, skipping both TCP stacks. The peer reads that queue before
 * its TCP queue, so a socket may go from redirecting to plain TCP, never the
 * other way: its first message decides (if the peer was not in the map yet,
 * the app wrote before the proxy's side was established, and every byte
 * keeps TCP), and it turns to TCP for good once SM_ACCEL_BUDGET bytes went
 * unanswered, or lie unread in its own queue, or the peer left (the peer's
 * close then resets it as TCP would).
 */
SEC("sk_msg")
int sm_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	if (!sk)
		return SK_PASS;
	struct sm_accel_sock *a = bpf_sk_storage_get(&sm_accel_sk, sk, 0, 0);
	if (!a || a->state == SM_ACCEL_PLAIN)
		return SK_PASS;
	struct sm_accel_conn *c = bpf_map_lookup_elem(&sm_accel_conns, &a->peer.conn);
	if (!c) {
		/* The application socket closed (it owns the entry). */
		a->state = SM_ACCEL_PLAIN;
		sm_accel_count(peer_gone);
		return SK_PASS;
	}
	/* unanswered[] is indexed by side - 1. */
	__u32 peer = a->peer.side == SM_SIDE_APP ? 0 : 1;
	__u32 self = 1 - peer;
	__u32 size = msg->size;
	/* The peer is not reading (a stream, an upload), or this socket's own
	 * app is not (it pipelines requests and leaves the answers): TCP from
	 * now on, whose windows push back. */
	if (c->unanswered[self] + size > SM_ACCEL_BUDGET || sm_accel_unread(sk) > SM_ACCEL_BUDGET) {
		a->state = SM_ACCEL_PLAIN;
		sm_accel_count(over_budget);
		return SK_PASS;
	}
	if (bpf_msg_redirect_hash(msg, &sm_accel, &a->peer, BPF_F_INGRESS) != SK_PASS) {
		if (a->state == SM_ACCEL_UNDECIDED)
			sm_accel_count(peer_missing);
		else
			sm_accel_count(peer_gone);
		a->state = SM_ACCEL_PLAIN;
		return SK_PASS;
	}
	if (a->state == SM_ACCEL_UNDECIDED) {
		a->state = SM_ACCEL_REDIRECTING;
		sm_accel_count(redirected);
	}
	c->unanswered[self] += size;
	/* This message answers the peer: its budget starts again. */
	c->unanswered[peer] = 0;
	return SK_PASS;
}

/*
 * sm_answer_kind decides whether a getsockopt call is SO_ORIGINAL_DST in the
 * family of the stored destination (family 0: nothing stored) with room for
 * the answer. Anything else keeps the kernel's own answer.
 */
static __always_inline enum sm_answer sm_answer_kind(int level, int optname, int buf_len,
						     __u32 family)
{
	if (level == SOL_IP && optname == SO_ORIGINAL_DST && family == SM_FAMILY_V4 &&
	    buf_len >= (int)sizeof(struct sockaddr_in))
		return SM_ANSWER_V4;
	if (level == SOL_IPV6 && optname == IP6T_SO_ORIGINAL_DST && family == SM_FAMILY_V6 &&
	    buf_len >= (int)sizeof(struct sockaddr_in6))
		return SM_ANSWER_V6;
	return SM_ANSWER_NONE;
}

SEC("cgroup/getsockopt")
int sm_getsockopt(struct bpf_sockopt *ctx)
{
	/* Cheap test first: this hook runs for every getsockopt in the cgroup. */
	if (ctx->optname != SO_ORIGINAL_DST)
		return SM_ALLOW;
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return SM_ALLOW;
	struct sm_orig_dst *o = bpf_sk_storage_get(&sm_proxy_sk, sk, 0, 0);
	if (!o)
		return SM_ALLOW;

	void *buf = (void *)(long)ctx->optval;
	void *end = (void *)(long)ctx->optval_end;
	switch (sm_answer_kind(ctx->level, ctx->optname, end - buf, o->family)) {
	case SM_ANSWER_V4: {
		struct sockaddr_in *sin = buf;
		if ((void *)(sin + 1) > end)
			return SM_ALLOW;
		__builtin_memset(sin, 0, sizeof(*sin));
		sin->sin_family = AF_INET;
		sin->sin_port = o->port;
		sin->sin_addr.s_addr = o->addr[3];
		ctx->optlen = sizeof(*sin);
		ctx->retval = 0;
		return SM_ALLOW;
	}
	case SM_ANSWER_V6: {
		struct sockaddr_in6 *sin6 = buf;
		if ((void *)(sin6 + 1) > end)
			return SM_ALLOW;
		__builtin_memset(sin6, 0, sizeof(*sin6));
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = o->port;
		sin6->sin6_addr.in6_u.u6_addr32[0] = o->addr[0];
		sin6->sin6_addr.in6_u.u6_addr32[1] = o->addr[1];
		sin6->sin6_addr.in6_u.u6_addr32[2] = o->addr[2];
		sin6->sin6_addr.in6_u.u6_addr32[3] = o->addr[3];
		ctx->optlen = sizeof(*sin6);
		ctx->retval = 0;
		return SM_ALLOW;
	}
	default:
		return SM_ALLOW;
	}
}

/* Test shims: Go runs the decisions above with prog.Run against real maps. */

SEC("syscall")
int sm_test_decide(struct sm_decide_args *args)
{
	struct sm_flow f = args->flow;
	__u32 proxy_addr[4] = {};
	__u16 proxy_port = 0;
	__u64 proxy_netns = 0;

	args->decision = sm_decide(&f, proxy_addr, &proxy_port, &proxy_netns);
	args->proxy_port = proxy_port;
	args->proxy_addr[0] = proxy_addr[0];
	args->proxy_addr[1] = proxy_addr[1];
	args->proxy_addr[2] = proxy_addr[2];
	args->proxy_addr[3] = proxy_addr[3];
	return 0;
}

SEC("syscall")
int sm_test_answer(struct sm_answer_args *args)
{
	args->answer = sm_answer_kind(args->level, args->optname, args->buf_len, args->family);
	return 0;
}
