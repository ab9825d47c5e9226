/* Socket payload capture. Included by capture.c after common.h.
 *
 * Where: sock_recv_length / sock_send_length. They fire inside
 * sock_recvmsg/sock_sendmsg only (socket I/O, not every syscall), after the
 * bytes are in (recv) or taken from (send) the user buffer. Hooked as raw
 * tracepoints (SOCK_RAW_TP): TP_PROTO(struct sock *sk, int ret, int flags),
 * no trace record built, so an untraced process pays only the filter, which
 * runs first; a traced one's first event on a socket then reads
 * sk->__sk_common.skc_family and sk->sk_protocol at offsets user space found
 * in the running kernel's BTF (-DSK_FAMILY_OFF, -DSK_PROTOCOL_OFF/SIZE;
 * otelbpf/sources/btf.py, checked on live sockets at start by
 * sk_offsets_check), never by header layout, and keeps them in the
 * connection's entry (conns) for the events after it.
 * Without BTF offsets (or OTELBPF_SOCK_TRACEPOINTS=classic) the classic
 * sock:sock_*_length tracepoints, whose record carries family and protocol,
 * do the same at ~3% of host-wide socket throughput (bench/probe_tax.py).
 * Either way: the sock pointer, family, protocol, byte count (ret) and recv
 * flags. The syscall
 * that got there, its fd and its buffer come from the saved user registers
 * (common.h). Handled: read, write, readv, writev, recvfrom, sendto,
 * recvmsg, sendmsg, recvmmsg, sendmmsg (one firing per datagram), and
 * sendfile/splice into a socket (counted with DF_SENDFILE, not captured).
 * Other callers (io_uring, kernel sockets) are ignored.
 *
 * No syscall tracepoint is used for streams: enabling any syscalls:*
 * tracepoint puts every syscall of every task on the host on the kernel's
 * slow tracing path (bench/probe_tax.py measured ~0.9x on nginx with nothing
 * traced). Instead:
 *   - roles: the TCP state change into ESTABLISHED says whether the socket
 *     came from SYN_SENT (connect) or SYN_RECV (accept);
 *   - the end of a TCP connection: its state reaching TCP_CLOSE (the socket
 *     is done: both FINs, a reset, or the FIN_WAIT2 timeout), mapped back to
 *     (process, fd) through sk_owner; an fd reused for another socket and a
 *     process exit end connections too;
 *   - the end of a Unix stream connection: a read returning 0 (EOF).
 * UDP needs per-syscall tracepoints (sendmmsg/recvmmsg enter: which entry a
 * datagram is; recvfrom/recvmsg/recvmmsg exit: the kernel copies a sender's
 * address to user memory only after sock_recvmsg returns), so UDP capture
 * (CAPTURE_UDP, `otelbpf run --udp`) is opt-in and says what it costs.
 *
 * Stream sockets (TCP, Unix) -> EV_DATA; UDP -> EV_DATAGRAM with the peer.
 * Connection tuple: sock:inet_sock_set_state at ESTABLISHED (TCP), keyed by
 * the sock pointer; otherwise user space reads /proc.
 */

#define MY_AF_UNIX 1
#define MY_AF_INET 2
#define MY_AF_INET6 10
#define MY_IPPROTO_TCP 6
#define MY_IPPROTO_UDP 17
#define MY_MSG_PEEK 2
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define TCP_CLOSE 7
#define MMSGHDR_SIZE 64 /* struct mmsghdr on 64-bit: msghdr (56) + msg_len + pad */

#define SK_STREAM 1
#define SK_DGRAM 2

/* 1: payload capture on the raw sock_*_length tracepoints, reading
 * sk_family/sk_protocol at BTF offsets (-DSK_*); 0: the classic ones. */
#ifndef SOCK_RAW_TP
#define SOCK_RAW_TP 0
#endif
#ifndef SK_CHECK_LEN
#define SK_CHECK_LEN 7919 /* the start-up offset check's datagram lengths: this + 0..3 */
#endif

enum io_kind {
    IO_BUF = 1,      /* one flat buffer */
    IO_IOV = 2,      /* iovec array */
    IO_MSG = 3,      /* user msghdr */
    IO_SENDFILE = 4, /* sendfile/splice: counted only */
    IO_UNKNOWN = 5,  /* an mmsg entry we cannot place: counted only */
};

struct conn_key {
    __u32 tgid;
    __s32 fd;
};

struct conn_val {
    __u64 conn_id; /* 0 until data is first seen */
    __u64 sk;
    __u64 peer_sk;
    __u8 role;
    __u8 muted; /* bit (1 << source) set by user space: stop copying that source */
    /* The socket's family and protocol, kept so that the next events of the
     * connection need not read them from struct sock (raw tracepoints). */
    __u16 family;
    __u8 protocol;
    /* bit (1 << source) set by user space: its bodies are wanted (an LLM
     * call's stream), capture its big reads and writes whole (emit_whole) */
    __u8 whole;
    /* Cross-node trace context (bpf/propagate.c): which end this is and
     * whether a request read on it is open (PROP_* bits there); the thread
     * that read that request. */
    __u8 prop;
    __u8 prop_pad;
    /* When its TCP socket reached TCP_CLOSE (close sent then), 0 while open.
     * A send or receive already under way when the socket closed (a write
     * whose own segment drew the peer's RST) still lands here, stamped just
     * before the close so user space sees it first. */
    __u64 closed_ts;
    __u32 reader_tid;
    __u32 reader_pad;
};

/* conn_val.prop (bpf/propagate.c) */
#define PROP_SERVES 1  /* a server's end (accepted; a Unix socket read first) */
#define PROP_CALLS 2   /* a client's end (connected) */
#define PROP_OPEN 4    /* a request read on it is not answered yet */
#define PROP_CARRIED 8 /* a request on it came with a context */
/* what prop_stream_io has for the record */
#define PROP_IO_REPORT 1 /* ctx: a client's context, for this write's record */
#define PROP_IO_SERVED 2 /* ctx: a served request starts here; prop_served_commit once the payload is seen */
#define PROP_IO_MAYBE 3  /* ctx: an option inside the read; prop_served_commit decides with the payload */

struct tuple {
    __u16 family;
    __u16 local_port;
    __u16 peer_port;
    __u8 role; /* enum role_hint, from the state ESTABLISHED was reached from */
    __u8 pad;
    __u8 local_addr[16];
    __u8 peer_addr[16];
    __u64 established_ts; /* tells a recycled sock (freed, reused) from a closed one */
};

/* Which syscall moved the bytes, and where its buffers are. */
struct sock_io {
    __u64 ts;
    __u64 sk;
    __u64 peer_sk;
    __u64 buf;  /* flat buffer, iovec array or msghdr (user pointers) */
    __u64 addr; /* UDP: user sockaddr of the peer, 0 if none */
    __s32 fd;
    __u32 iovcnt;
    __u32 total;
    __u16 family;
    __u8 protocol;
    __u8 kind;
    __u8 direction;
    __u8 flags;
    __u8 uses; /* the process's USES_* bits (common.h) */
};

/* recvmmsg/sendmmsg in flight on a thread: which entry the next datagram is. */
struct mmsg_state {
    __u64 vec;
    __u32 vlen;
    __u32 next;
    __u32 nr;
    __u32 pad;
};

/* A UDP receive whose sender address is copied out after sock_recvmsg: its
 * record is emitted at the syscall's exit. */
struct udp_pending {
    struct sock_io io;
    __u32 nr;
    __u32 pad;
};

struct data_record {
    struct event_hdr hdr;
    /* Twice the capture size so the verifier accepts offset + length
     * bounds when several iovecs are gathered. */
    __u8 data[CAPTURE_BYTES * 2];
};

struct datagram_record {
    struct event_hdr hdr;
    struct datagram_info info;
    __u8 data[CAPTURE_BYTES * 2];
};

struct conn_record {
    struct event_hdr hdr;
    struct conn_info info;
};

struct msghdr_user {
    __u64 name;
    __u32 namelen;
    __u32 pad;
    __u64 iov;
    __u64 iovlen;
};

BPF_TABLE("lru_hash", struct conn_key, struct conn_val, conns, 65536);
BPF_TABLE("lru_hash", __u64, struct tuple, sk_tuples, 65536);
/* TCP sock -> the (process, fd) whose connection it carries: ends it at TCP_CLOSE. */
BPF_TABLE("lru_hash", __u64, struct conn_key, sk_owner, 65536);
BPF_ARRAY(conn_seq, __u64, 1);
BPF_PERCPU_ARRAY(scratch, struct data_record, 1);
BPF_PERCPU_ARRAY(dgram_scratch, struct datagram_record, 1);
BPF_TABLE("lru_hash", __u32, struct mmsg_state, mmsg_states, 16384);
BPF_HASH(udp_rx, __u32, struct udp_pending, 16384);
/* The socket a traced thread's send woke (sk_data_ready), and when.
 * Unix pairing: it names the other end. Timing: on loopback the receiver
 * can be woken, read and return before sock_send_length fires at the end of
 * the send, so a send is stamped with this first wake-up instead.
 * One slot per CPU, owned by the thread whose wake-up it holds: the wake-up
 * and the send's sock_send_length run in the same syscall, on the same CPU
 * unless the send was preempted and moved in between (then the send has no
 * wake-up: unstamped, its pairing left to a later send). A per-tid LRU hash
 * cost an update and two deletes per request, each a hash walk and an LRU
 * list operation: the largest share of the capture's cost in perf. */
struct woken {
    __u64 sk;
    __u64 ts;
    __u32 tid; /* 0: empty */
    __u32 unused;
};
BPF_PERCPU_ARRAY(woken_sk, struct woken, 1);

static __always_inline void emit_close(__u32 tgid, __u32 tid, int fd, __u64 conn_id, __u64 ts);
/* bpf/tls.c: a traced thread's stream I/O, for TLS attribution (also when muted). */
static __always_inline void tls_saw_socket_io(__u64 id, struct sock_io *io, __u64 conn_id);
#if PROPAGATION
/* bpf/propagate.c: a connection's served request and client context at each
 * stream I/O (also when muted), and when its entry goes. */
static __always_inline int prop_stream_io(__u64 id, struct sock_io *io, struct conn_val *entry, struct trace_ctx *ctx);
static __always_inline int prop_served_commit(__u64 id, struct sock_io *io, struct conn_val *entry,
                                              struct trace_ctx *ctx, __u8 *data, __u64 captured, int how);
static __always_inline void prop_connection_over(__u32 tgid, struct conn_val *entry);
/* What prop_served_commit did: the receive tracepoint tail-calls prop_header_scan
 * after it (PROP_SCAN: verified on its own, and run only then); ctx is the record's. */
#define PROP_SCAN 1
#define PROP_HAS_CTX 2
BPF_PROG_ARRAY(prop_after_receive, 1);
#endif

/* The TCP socket sk is done: end the connection it carried, if still ours.
 * The entry stays (marked closed) until the fd is reused or evicted. */
static __always_inline void end_connection_of(__u64 sk)
{
    struct conn_key *owner = sk_owner.lookup(&sk);
    if (!owner)
        return;
    struct conn_key key = *owner;
    sk_owner.delete(&sk);
    struct conn_val *known = conns.lookup(&key);
    if (!known || known->sk != sk || known->closed_ts)
        return; /* the fd moved on to another socket (its close was sent then) */
#if PROPAGATION
    prop_connection_over(key.tgid, known);
#endif
    __u64 now = bpf_ktime_get_ns();
    known->closed_ts = now;
    if (known->conn_id)
        emit_close(key.tgid, 0, key.fd, known->conn_id, now);
}

/* ---- connection tuples and roles, from the TCP state machine ---- */

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != MY_IPPROTO_TCP)
        return 0;
    __u64 sk = (__u64)args->skaddr;
    if (args->newstate == TCP_CLOSE) {
        sk_tuples.delete(&sk);
        end_connection_of(sk);
        return 0;
    }
    /* ESTABLISHED carries the whole tuple on both sides (SYN_SENT has no
     * source port yet). Local is "source" for both: for an accepted
     * socket the kernel's sport is the listening port. */
    if (args->newstate != TCP_ESTABLISHED)
        return 0;
    struct tuple t = {};
    t.established_ts = bpf_ktime_get_ns();
    if (args->oldstate == TCP_SYN_SENT)
        t.role = ROLE_CONNECTED;
    else if (args->oldstate == TCP_SYN_RECV)
        t.role = ROLE_ACCEPTED;
    t.family = args->family;
    t.local_port = args->sport;
    t.peer_port = args->dport;
    if (args->family == MY_AF_INET) {
        __builtin_memcpy(t.local_addr, args->saddr, 4);
        __builtin_memcpy(t.peer_addr, args->daddr, 4);
    } else {
        __builtin_memcpy(t.local_addr, args->saddr_v6, 16);
        __builtin_memcpy(t.peer_addr, args->daddr_v6, 16);
    }
    sk_tuples.update(&sk, &t);
    return 0;
}

/* ---- connection identity ---- */

static __always_inline void emit_close(__u32 tgid, __u32 tid, int fd, __u64 conn_id, __u64 ts)
{
    struct event_hdr *rec = events.ringbuf_reserve(sizeof(struct event_hdr));
    if (!rec) {
        count_stat(STAT_LOST);
        return;
    }
    __builtin_memset(rec, 0, sizeof(*rec));
    rec->ts_ns = ts;
    rec->conn_id = conn_id;
    rec->tgid = tgid;
    rec->tid = tid;
    rec->fd = fd;
    rec->type = EV_CONN_CLOSE;
    events.ringbuf_submit(rec, ring_wakeup_flags());
}

static __always_inline void emit_conn_info(__u64 id, struct sock_io *io, __u64 conn_id, __u8 role, __u8 type)
{
    struct conn_record *rec = events.ringbuf_reserve(sizeof(struct conn_record));
    if (!rec) {
        count_stat(STAT_LOST);
        return;
    }
    __builtin_memset(rec, 0, sizeof(*rec));
    rec->hdr.ts_ns = io->ts;
    rec->hdr.conn_id = conn_id;
    rec->hdr.tgid = id >> 32;
    rec->hdr.tid = (__u32)id;
    rec->hdr.fd = io->fd;
    rec->hdr.type = type;
    rec->info.role = role;
    rec->info.protocol = io->protocol;
    rec->info.sock_id = io->sk;
    rec->info.peer_sock_id = io->peer_sk;
    __u64 sk = io->sk;
    struct tuple *t = sk_tuples.lookup(&sk);
    if (t) {
        if (role == ROLE_UNKNOWN)
            rec->info.role = t->role;
        rec->info.family = t->family;
        rec->info.local_port = t->local_port;
        rec->info.peer_port = t->peer_port;
        __builtin_memcpy(rec->info.local_addr, t->local_addr, 16);
        __builtin_memcpy(rec->info.peer_addr, t->peer_addr, 16);
    } else {
        /* Opened before the agent started, or not TCP: user space
         * resolves the tuple from /proc while the socket still lives. */
        rec->info.family = io->family == MY_AF_UNIX ? MY_AF_UNIX : 0;
        count_stat(STAT_NO_TUPLE);
    }
    bpf_get_current_comm(&rec->info.comm, sizeof(rec->info.comm));
    events.ringbuf_submit(rec, ring_wakeup_flags());
}

/* Server endpoints whose connections are captured whole from their first
 * byte: user space adds one when it marks a connection for whole capture (its
 * bodies are read: an LLM call), so the next connections to or from that
 * endpoint are marked before they carry anything, whatever user space's delay
 * (a client reading its first burst before the agent has seen the request).
 * The server's side of a TCP connection: an accepted socket's local address,
 * a connected socket's peer. Value: the sources' bits, as conn_val.whole. */
struct endpoint_key {
    __u16 family;
    __u16 port;
    __u32 pad;
    __u8 addr[16];
};
BPF_TABLE("lru_hash", struct endpoint_key, __u8, whole_endpoints, 4096);

/* The whole-capture bits a new connection on a socket whose tuple is t
 * inherits from its server endpoint (0 for one without a tuple: a Unix
 * socket, one older than the agent). */
static __always_inline __u8 endpoint_whole(struct tuple *t)
{
    if (!t)
        return 0;
    struct endpoint_key key = {};
    key.family = t->family;
    if (t->role == ROLE_ACCEPTED) {
        key.port = t->local_port;
        __builtin_memcpy(key.addr, t->local_addr, 16);
    } else if (t->role == ROLE_CONNECTED) {
        key.port = t->peer_port;
        __builtin_memcpy(key.addr, t->peer_addr, 16);
    } else {
        return 0;
    }
    __u8 *bits = whole_endpoints.lookup(&key);
    return bits ? *bits : 0;
}

/* The connection id for (tgid, fd), announcing the connection the first
 * time it carries data; 0 when user space muted it for socket capture.
 * `known`: conns' entry for (tgid, fd), looked up by the caller (or 0).
 * *whole: the connection's whole-capture bits (conn_val.whole); *entry (when
 * asked): conns' entry of the connection, muted or not. */
static __always_inline __u64 connection_known(__u64 id, struct sock_io *io, struct conn_val *known, __u8 *whole,
                                              struct conn_val **entry)
{
    struct conn_key key = {.tgid = id >> 32, .fd = io->fd};
    __u8 role = ROLE_UNKNOWN;
    if (known && known->conn_id && known->sk == io->sk && known->closed_ts) {
        /* Its socket closed. The same sock again is either a syscall that was
         * under way when it closed (stamped just before the close), or a new
         * connection on a sock the kernel freed and reused for this fd. */
        __u64 sk = io->sk;
        struct tuple *t = sk_tuples.lookup(&sk);
        if (t && t->established_ts > known->closed_ts)
            known = 0; /* recycled: a new connection (the old one's close was sent) */
        else if (io->ts >= known->closed_ts)
            io->ts = known->closed_ts - 1;
    }
    if (known) {
        if (known->conn_id && known->sk == io->sk) {
            if (io->peer_sk && !known->peer_sk) {
                known->peer_sk = io->peer_sk;
                emit_conn_info(id, io, known->conn_id, known->role, EV_CONN_PEER);
            }
            tls_saw_socket_io(id, io, known->conn_id);
            *whole = known->whole;
            if (entry)
                *entry = known;
            return (known->muted & (1 << SOURCE_SOCKET)) ? 0 : known->conn_id;
        }
#if PROPAGATION
        prop_connection_over(key.tgid, known);
#endif
        if (known->conn_id && !known->closed_ts) /* fd reused for another socket: the old one is over */
            emit_close(key.tgid, (__u32)id, io->fd, known->conn_id, bpf_ktime_get_ns());
        else
            role = known->role;
    }
    int zero = 0;
    __u64 *seq = conn_seq.lookup(&zero);
    if (!seq)
        return 0;
    struct conn_val fresh = {};
    fresh.conn_id = __sync_fetch_and_add(seq, 1) + 1;
    fresh.sk = io->sk;
    fresh.peer_sk = io->peer_sk;
    fresh.role = role;
    fresh.family = io->family;
    fresh.protocol = io->protocol;
    if (io->protocol == MY_IPPROTO_TCP) {
        __u64 sk = io->sk;
        struct tuple *t = sk_tuples.lookup(&sk);
        fresh.whole = endpoint_whole(t);
#if PROPAGATION
        /* which end: the TCP state machine said (connections older than the agent: neither) */
        if (t && t->role == ROLE_ACCEPTED)
            fresh.prop = PROP_SERVES;
        else if (t && t->role == ROLE_CONNECTED)
            fresh.prop = PROP_CALLS;
#endif
    }
#if PROPAGATION
    else if (io->family == MY_AF_UNIX && io->direction == DIR_INGRESS)
        fresh.prop = PROP_SERVES; /* a Unix stream server reads first */
#endif
    *whole = fresh.whole;
    conns.update(&key, &fresh);
    if (io->protocol == MY_IPPROTO_TCP)
        sk_owner.update(&io->sk, &key);
    emit_conn_info(id, io, fresh.conn_id, role, EV_CONN_OPEN);
    tls_saw_socket_io(id, io, fresh.conn_id);
    if (entry)
        *entry = conns.lookup(&key);
    return fresh.conn_id;
}

static __always_inline __u64 connection_for(__u64 id, struct sock_io *io)
{
    struct conn_key key = {.tgid = id >> 32, .fd = io->fd};
    __u8 whole = 0;
    return connection_known(id, io, conns.lookup(&key), &whole, 0);
}

/* ---- copying payloads ---- */

/* A gather in progress: its bounds and how far it got. Kept in a per-CPU
 * map, not in registers, on purpose: the verifier does not track a map
 * value's contents, so each iteration starts from the same unknown (bounded)
 * state and the paths of one iteration merge at the next, instead of every
 * branch's exact ranges multiplying through the loop (16 iovecs cost 331k
 * verified instructions that way, 24 hit the 1M limit). bench/verifier_cost.py
 * measures it. */
struct iovec_user {
    __u64 base;
    __u64 len;
};

/* iovecs read with one helper call before the loop (nginx writes a response
 * as 2, gRPC 4-8): the loop then reads only the payloads of these. */
#define IOV_BATCH 4

struct gather {
    __u64 iov_ptr;
    __u32 iovcnt;
    __u32 total;
    __u32 captured;
    __u32 consumed;
    __u32 batched; /* how many of first[] were read */
    /* Where the copy stopped at CAPTURE_BYTES: the iovec, and the bytes of it
     * taken (emit_whole_gathered goes on from there). */
    __u32 at_index;
    __u64 at_offset;
    struct iovec_user first[IOV_BATCH];
};
BPF_PERCPU_ARRAY(gathers, struct gather, 1);

/* Copy up to CAPTURE_BYTES of the iovec array into data. */
static __always_inline __u64 gather_iov(__u8 *data, __u64 iov_ptr, __u32 iovcnt, __u32 total, __u8 *flags)
{
    int zero = 0;
    volatile struct gather *g = gathers.lookup(&zero);
    if (!g)
        return 0;
    g->iov_ptr = iov_ptr;
    g->iovcnt = iovcnt;
    g->total = total;
    g->captured = 0;
    g->consumed = 0;
    g->batched = 0;
    __u32 batched = iovcnt < IOV_BATCH ? iovcnt : IOV_BATCH;
    __u64 size = (__u64)batched * sizeof(struct iovec_user);
    BOUND_FOR_VERIFIER(size, sizeof(g->first));
    if (size && bpf_probe_read_user((void *)g->first, size, (void *)iov_ptr) == 0)
        g->batched = batched;
    /* A bounded loop (kernel >= 5.3 verifies it without unrolling). */
    for (int i = 0; i < MAX_IOV; i++) {
        __u32 captured = g->captured;
        __u32 consumed = g->consumed;
        __u32 limit = g->total;
        if (i >= g->iovcnt || consumed >= limit || captured >= CAPTURE_BYTES)
            break;
        struct iovec_user iov = {};
        if (i < IOV_BATCH && i < g->batched) {
            iov.base = g->first[i].base;
            iov.len = g->first[i].len;
        } else if (bpf_probe_read_user(&iov, sizeof(iov), (void *)(g->iov_ptr + i * sizeof(iov))) != 0) {
            break;
        }
        __u64 left = limit - consumed;
        __u64 part = iov.len < left ? iov.len : left;
        __u64 room = CAPTURE_BYTES - captured;
        __u64 take = part < room ? part : room;
        __u64 offset = captured;
        BOUND_FOR_VERIFIER(offset, CAPTURE_BYTES - 1);
        BOUND_FOR_VERIFIER(take, CAPTURE_BYTES);
        bpf_probe_read_user(&data[offset], take, (void *)iov.base);
        g->captured = captured + take;
        g->consumed = consumed + part;
        g->at_index = i;
        g->at_offset = take;
    }
    __u32 captured = g->captured;
    if (g->consumed < g->total && captured < CAPTURE_BYTES)
        *flags |= DF_IOV_TRUNCATED;
    return captured;
}

/* The payload of io into data; returns the bytes captured. For IO_MSG,
 * also returns the msghdr's name pointer (a UDP peer address) in *name. */
static __always_inline __u64 copy_payload(__u8 *data, struct sock_io *io, __u64 *name)
{
    __u64 captured = 0;
    if (io->kind == IO_BUF) {
        captured = io->total < CAPTURE_BYTES ? io->total : CAPTURE_BYTES;
        BOUND_FOR_VERIFIER(captured, CAPTURE_BYTES);
        bpf_probe_read_user(data, captured, (void *)io->buf);
    } else if (io->kind == IO_IOV || io->kind == IO_MSG) {
        /* One gather_iov call site: inlined once, so the verifier walks its loop once. */
        __u64 iov_ptr = io->buf;
        __u32 iovcnt = io->iovcnt;
        if (io->kind == IO_MSG) {
            struct msghdr_user msg = {};
            iovcnt = 0;
            if (bpf_probe_read_user(&msg, sizeof(msg), (void *)io->buf) == 0) {
                iov_ptr = msg.iov;
                iovcnt = (__u32)msg.iovlen;
                if (name)
                    *name = msg.name;
            }
        }
        captured = gather_iov(data, iov_ptr, iovcnt, io->total, &io->flags);
    } else if (io->kind == IO_SENDFILE) {
        io->flags |= DF_SENDFILE;
    } else {
        io->flags |= DF_MMSG_UNKNOWN;
    }
    return captured;
}

static __always_inline void fill_hdr(struct event_hdr *hdr, __u64 id, struct sock_io *io, __u64 conn_id, __u8 type)
{
    hdr->ts_ns = io->ts;
    hdr->conn_id = conn_id;
    hdr->tgid = id >> 32;
    hdr->tid = (__u32)id;
    hdr->fd = io->fd;
    hdr->type = type;
    hdr->direction = io->direction;
    hdr->source = SOURCE_SOCKET;
    hdr->total_len = io->total;
    hdr->task_id = current_task_id(io->uses, (__u32)id);
}

/* ---- whole capture of marked connections (capture.h, DF_PIECE; common.h) ---- */

/* A gathered call's pieces are built in this per-CPU scratch, then copied to
 * the ring (a piece spans iovecs: it is not read in place like a flat
 * buffer's). Twice the piece size: the verifier's bound for a copy of up to a
 * piece at an offset inside one (and a per-CPU value is at most 32 KiB). */
struct gather_piece {
    struct event_hdr hdr;
    __u8 data[2 * WHOLE_GATHER_PIECE_BYTES];
};
BPF_PERCPU_ARRAY(gather_pieces, struct gather_piece, 1);

/* Steps of emit_whole_gathered's loop: each one loads an iovec or fills a piece. */
#define WHOLE_GATHER_STEPS \
    (MAX_IOV + (WHOLE_CAPTURE_BYTES - CAPTURE_BYTES + WHOLE_GATHER_PIECE_BYTES - 1) / WHOLE_GATHER_PIECE_BYTES + 1)

/* iovec `index` of the gather in `g`: from the batch read before gather_iov's
 * loop, else from user memory. 0 when unreadable. */
static __always_inline int gather_iovec(volatile struct gather *g, __u32 index, struct iovec_user *iov)
{
    if (index < IOV_BATCH && index < g->batched) {
        iov->base = g->first[index].base;
        iov->len = g->first[index].len;
        return 1;
    }
    return bpf_probe_read_user(iov, sizeof(*iov), (void *)(g->iov_ptr + (__u64)index * sizeof(*iov))) == 0;
}

/* Send the piece built in `piece` (its `fill` bytes end at the call's offset
 * `done`): the last one (done >= end, or `cut`) stands for the rest of the
 * call. Returns 0 when the ring refused it (counted lost). */
static __always_inline int gather_piece_out(struct gather_piece *piece, volatile struct whole_call *w, __u64 fill,
                                            __u64 done, int cut)
{
    piece->hdr.captured_len = fill;
    piece->hdr.total_len = done >= w->end || cut ? w->total - (done - fill) : fill;
    if (cut == 2)
        piece->hdr.flags |= DF_IOV_TRUNCATED;
    BOUND_FOR_VERIFIER(fill, WHOLE_GATHER_PIECE_BYTES);
    if (events.ringbuf_output(piece, sizeof(struct event_hdr) + fill, w->wakeup) != 0) {
        count_stat(STAT_LOST);
        return 0;
    }
    return 1;
}

/* The bytes of a gathered call (readv, writev, recvmsg, sendmsg) past the first
 * record's CAPTURE_BYTES, up to `end` (whole_end), as pieces of up to
 * WHOLE_GATHER_PIECE_BYTES that span iovecs as the bytes do: gather_iov left
 * the iovec array and where it stopped in `gathers`. Past MAX_IOV iovecs the
 * rest is cut: the last piece stands for it, flagged DF_IOV_TRUNCATED. */
static __always_inline void emit_whole_gathered(struct event_hdr *hdr, __u64 total, __u64 end)
{
    int zero = 0;
    volatile struct gather *g = gathers.lookup(&zero);
    struct gather_piece *piece = gather_pieces.lookup(&zero);
    if (!g || !piece)
        return;
    volatile struct whole_call *w = whole_start(hdr, total, end, SOURCE_SOCKET);
    if (!w)
        return;
    __builtin_memcpy(&piece->hdr, (void *)&w->hdr, sizeof(struct event_hdr));
    /* the rest of the iovec the prefix stopped in */
    __u32 at = g->at_index;
    __u64 skip = g->at_offset;
    struct iovec_user iov = {};
    w->index = at + 1;
    w->fill = 0;
    w->left = 0;
    if (gather_iovec(g, at, &iov) && iov.len > skip) {
        w->buf = iov.base + skip;
        w->left = iov.len - skip;
    }
    int cut = 0; /* 1: unreadable, 2: past MAX_IOV */
    for (int i = 0; i < WHOLE_GATHER_STEPS; i++) {
        __u64 offset = w->offset;
        __u64 stop = w->end;
        if (offset >= stop)
            break;
        __u64 left = w->left;
        __u64 base = w->buf;
        if (!left) {
            __u32 index = w->index;
            if (index >= g->iovcnt || index >= MAX_IOV) {
                cut = 2;
                break;
            }
            struct iovec_user next = {};
            if (!gather_iovec(g, index, &next)) {
                cut = 1;
                break;
            }
            w->index = index + 1;
            base = next.base;
            left = next.len;
            if (!left)
                continue;
        }
        __u64 fill = w->fill;
        __u64 take = stop - offset;
        if (take > left)
            take = left;
        if (take > WHOLE_GATHER_PIECE_BYTES - fill)
            take = WHOLE_GATHER_PIECE_BYTES - fill;
        BOUND_FOR_VERIFIER(fill, WHOLE_GATHER_PIECE_BYTES - 1);
        BOUND_FOR_VERIFIER(take, WHOLE_GATHER_PIECE_BYTES);
        if (bpf_probe_read_user(&piece->data[fill], take, (void *)base) != 0) {
            cut = 1; /* cannot happen after the call moved them: counted missing */
            break;
        }
        w->buf = base + take;
        w->left = left - take;
        w->offset = offset + take;
        fill += take;
        if (fill >= WHOLE_GATHER_PIECE_BYTES || offset + take >= stop) {
            if (!gather_piece_out(piece, w, fill, offset + take, 0))
                return;
            fill = 0;
        }
        w->fill = fill;
    }
    __u64 offset = w->offset;
    if (offset < w->end || w->fill) /* cut short: a last piece (maybe empty) stands for the rest */
        gather_piece_out(piece, w, w->fill, offset, cut ? cut : 1);
}

static __always_inline int emit_stream(__u64 id, struct sock_io *io, struct conn_val *known)
{
    if (io->family != MY_AF_UNIX)
        io->peer_sk = 0; /* a TCP receiver woken on loopback is not a pairing */
    __u8 whole = 0;
#if PROPAGATION
    struct conn_val *entry = 0;
    __u64 conn_id = connection_known(id, io, known, &whole, &entry);
    /* the served request's bookkeeping and the client's context, muted or not (bpf/propagate.c) */
    struct trace_ctx ctx;
    int prop = entry ? prop_stream_io(id, io, entry, &ctx) : 0;
    if (!conn_id) {
        if (prop >= PROP_IO_SERVED)
            prop_served_commit(id, io, entry, &ctx, 0, 0, prop);
        return 0;
    }
    int scan = 0;
    __u64 extra = prop ? sizeof(struct trace_ctx) : 0;
#else
    __u64 conn_id = connection_known(id, io, known, &whole, 0);
    if (!conn_id)
        return 0;
    __u64 extra = 0;
#endif
    __u64 wanted = io->total < CAPTURE_BYTES ? io->total : CAPTURE_BYTES;
    /* Marked for whole capture, more than the prefix: the rest follows in
     * pieces (emit_whole, emit_whole_gathered). Unmarked calls pay one test. */
    __u64 end = 0;
    if (io->total > CAPTURE_BYTES && (whole & (1 << SOURCE_SOCKET)) && io->kind <= IO_MSG)
        end = whole_end(io->total, io->kind == IO_BUF ? WHOLE_PIECE_BYTES : WHOLE_GATHER_PIECE_BYTES);
    if (ring_full_for(sizeof(struct event_hdr) + wanted + extra))
        return 0;
    int zero = 0;
    struct data_record *rec = scratch.lookup(&zero);
    if (!rec)
        return 0;
    __u64 captured = copy_payload(rec->data, io, 0);
    fill_hdr(&rec->hdr, id, io, conn_id, EV_DATA);
    rec->hdr.flags = io->flags;
    rec->hdr.captured_len = captured;
    if (captured != CAPTURE_BYTES)
        end = 0; /* a gather cut short (the iovec bound, an unreadable iovec): the prefix it got */
    if (end) {
        rec->hdr.flags |= DF_PIECE;
        rec->hdr.total_len = captured;
    }
    BOUND_FOR_VERIFIER(captured, CAPTURE_BYTES);
#if PROPAGATION
    if (prop >= PROP_IO_SERVED) {
        int done = prop_served_commit(id, io, entry, &ctx, rec->data, captured, prop);
        scan = done & PROP_SCAN;
        if (!(done & PROP_HAS_CTX))
            prop = 0;
    }
    if (prop) { /* after the payload: capture.h, DF_TRACE_CTX */
        __builtin_memcpy(&rec->data[captured], &ctx, sizeof(ctx));
        rec->hdr.flags |= DF_TRACE_CTX;
    } else {
        extra = 0;
    }
#endif
    if (submit_stat(rec, sizeof(struct event_hdr) + captured + extra) == 0 && end) {
        if (io->kind == IO_BUF)
            emit_whole(&rec->hdr, io->buf, io->total, end, SOURCE_SOCKET);
        else
            emit_whole_gathered(&rec->hdr, io->total, end);
    }
#if PROPAGATION
    return scan; /* PROP_SCAN: the receive tracepoint tail-calls the header scan */
#else
    return 0;
#endif
}

/* Read a user sockaddr_in/in6 into info (family 0 when unreadable). */
static __always_inline void read_peer(struct datagram_info *info, __u64 addr)
{
    if (!addr)
        return;
    struct {
        __u16 family;
        __u16 port; /* network order */
        __u32 v4_or_flowinfo;
        __u8 v6[16];
    } sa = {};
    if (bpf_probe_read_user(&sa, sizeof(sa), (void *)addr) != 0)
        return;
    if (sa.family == MY_AF_INET) {
        info->family = MY_AF_INET;
        __builtin_memcpy(info->peer_addr, &sa.v4_or_flowinfo, 4);
    } else if (sa.family == MY_AF_INET6) {
        info->family = MY_AF_INET6;
        __builtin_memcpy(info->peer_addr, sa.v6, 16);
    } else {
        return;
    }
    info->peer_port = (__u16)((sa.port >> 8) | (sa.port << 8));
}

static __always_inline int emit_datagram(__u64 id, struct sock_io *io)
{
    __u64 conn_id = connection_for(id, io);
    if (!conn_id)
        return 0;
    __u64 wanted = io->total < CAPTURE_BYTES ? io->total : CAPTURE_BYTES;
    if (ring_full_for(sizeof(struct event_hdr) + sizeof(struct datagram_info) + wanted))
        return 0;
    int zero = 0;
    struct datagram_record *rec = dgram_scratch.lookup(&zero);
    if (!rec)
        return 0;
    __u64 name = io->addr;
    __u64 captured = copy_payload(rec->data, io, &name);
    fill_hdr(&rec->hdr, id, io, conn_id, EV_DATAGRAM);
    rec->hdr.flags = io->flags;
    rec->hdr.captured_len = captured;
    __builtin_memset(&rec->info, 0, sizeof(rec->info));
    rec->info.protocol = io->protocol;
    read_peer(&rec->info, name);
    BOUND_FOR_VERIFIER(captured, CAPTURE_BYTES);
    submit_stat(rec, sizeof(struct event_hdr) + sizeof(struct datagram_info) + captured);
    return 0;
}

/* ---- the socket tracepoints ---- */

static __always_inline __u8 socket_class(__u16 family, __u16 protocol)
{
    if (family == MY_AF_INET || family == MY_AF_INET6) {
        if (protocol == MY_IPPROTO_TCP)
            return SK_STREAM;
        if (protocol == MY_IPPROTO_UDP && CAPTURE_UDP)
            return SK_DGRAM;
        return 0;
    }
    if (family == MY_AF_UNIX && CAPTURE_UNIX)
        return SK_STREAM;
    return 0;
}

/* recvmmsg/sendmmsg: the msghdr of the entry this datagram is, from the
 * per-thread counter set at the syscall's enter. 0 when it cannot be
 * proven (no enter seen, another array, past vlen): counted, not captured. */
static __always_inline __u64 mmsg_entry(__u32 tid, long nr, __u64 vec)
{
    struct mmsg_state *st = mmsg_states.lookup(&tid);
    if (!st || st->nr != (__u32)nr || st->vec != vec || st->next >= st->vlen)
        return 0;
    __u64 entry = vec + (__u64)st->next * MMSGHDR_SIZE;
    st->next += 1;
    return entry;
}

/* A read on a Unix stream socket returned 0: the peer closed it, and no TCP
 * state machine will say so. End the connection. */
static __always_inline int on_unix_eof(__u64 id)
{
    void *regs = current_user_regs();
    long nr = current_syscall_nr(regs);
    if (nr != __NR_read && nr != __NR_recvfrom && nr != __NR_readv && nr != __NR_recvmsg)
        return 0;
    struct conn_key key = {.tgid = id >> 32, .fd = (int)syscall_arg(regs, 0)};
    struct conn_val *known = conns.lookup(&key);
    if (!known)
        return 0;
#if PROPAGATION
    prop_connection_over(key.tgid, known);
#endif
    if (known->conn_id)
        emit_close(key.tgid, (__u32)id, key.fd, known->conn_id, bpf_ktime_get_ns());
    conns.delete(&key);
    return 0;
}

#if SOCK_RAW_TP
/* Raw tracepoints pass only the sock pointer: read sk->__sk_common.skc_family
 * and sk->sk_protocol at the offsets user space found in the running kernel's
 * BTF (otelbpf/sources/btf.py). */
#if !defined(SK_FAMILY_OFF) || !defined(SK_PROTOCOL_OFF) || !defined(SK_PROTOCOL_SIZE)
#error "SK_* offsets missing: otelbpf.sources.ebpf_program plans them (from /sys/kernel/btf/vmlinux)"
#endif
static __always_inline void read_sock_class(__u64 sk, __u16 *family, __u16 *protocol)
{
    bpf_probe_read_kernel(family, sizeof(*family), (void *)(sk + SK_FAMILY_OFF));
    /* little-endian: a 1-byte field lands in the low byte */
    bpf_probe_read_kernel(protocol, SK_PROTOCOL_SIZE, (void *)(sk + SK_PROTOCOL_OFF));
}
#endif

/* One socket call of a traced process (id: its pid_tgid) moved ret bytes.
 * `has_class`: family and protocol came with the tracepoint (classic); else
 * (raw) they are taken from the connection's entry when it is this socket's,
 * and read from struct sock only for a socket not seen yet: the connection is
 * looked up first (by the fd in the syscall's registers), which the event
 * needs anyway. */
static __always_inline int on_traced_sock_length(__u64 id, __u64 sk, __u16 family, __u16 protocol, int ret, int rflags,
                                                 __u8 direction, int has_class)
{
    if (ret == 0) {
        /* a read returning 0 on a Unix stream: the peer closed it */
        if (direction != DIR_INGRESS || (rflags & MY_MSG_PEEK))
            return 0;
#if SOCK_RAW_TP
        if (!has_class)
            read_sock_class(sk, &family, &protocol);
#endif
        return family == MY_AF_UNIX ? on_unix_eof(id) : 0;
    }
    if (ret < 0)
        return 0;
    if (direction == DIR_INGRESS && (rflags & MY_MSG_PEEK)) /* will be read again */
        return 0;
    void *regs = current_user_regs();
    long nr = current_syscall_nr(regs);
    int fd = nr == __NR_splice ? (int)syscall_arg(regs, 2) : (int)syscall_arg(regs, 0); /* splice: fd_out */
    struct conn_key key = {.tgid = id >> 32, .fd = fd};
    struct conn_val *known = conns.lookup(&key);
    if (!has_class) {
        if (known && known->sk == sk && known->family && !known->closed_ts) {
            family = known->family;
            protocol = known->protocol;
        } else {
#if SOCK_RAW_TP
            read_sock_class(sk, &family, &protocol);
#endif
        }
    }
    __u8 cls = socket_class(family, protocol);
    if (!cls)
        return 0;

    struct sock_io io = {};
    io.ts = bpf_ktime_get_ns();
    io.sk = sk;
    io.family = family;
    io.protocol = (__u8)protocol;
    io.direction = direction;
    io.total = (__u32)ret;
    io.fd = fd;
    io.uses = process_uses(id >> 32);
    __u64 vec = 0;
    int deferred = 0; /* UDP receive with a sender address: at the exit */
    if (direction == DIR_INGRESS) {
#if HAVE_SK_DATA_READY
        int slot = 0;
        struct woken *seen = woken_sk.lookup(&slot);
        if (seen && seen->tid == (__u32)id)
            seen->tid = 0; /* a wake-up seen while receiving is not a send's */
#endif
        switch (nr) {
        case __NR_read:
        case __NR_recvfrom:
            io.kind = IO_BUF;
            io.buf = syscall_arg(regs, 1);
            if (nr == __NR_recvfrom && cls == SK_DGRAM) {
                io.addr = syscall_arg(regs, 4);
                deferred = io.addr != 0;
            }
            break;
        case __NR_readv:
            io.kind = IO_IOV;
            io.buf = syscall_arg(regs, 1);
            io.iovcnt = (__u32)syscall_arg(regs, 2);
            break;
        case __NR_recvmsg:
            io.kind = IO_MSG;
            io.buf = syscall_arg(regs, 1);
            deferred = cls == SK_DGRAM;
            break;
        case __NR_recvmmsg:
            vec = syscall_arg(regs, 1);
            io.buf = mmsg_entry((__u32)id, nr, vec);
            io.kind = io.buf ? IO_MSG : IO_UNKNOWN;
            if (!io.buf)
                count_stat(STAT_MMSG_UNKNOWN);
            deferred = cls == SK_DGRAM && io.buf;
            break;
        default:
            return 0;
        }
    } else {
        switch (nr) {
        case __NR_write:
        case __NR_sendto:
            io.kind = IO_BUF;
            io.buf = syscall_arg(regs, 1);
            if (nr == __NR_sendto)
                io.addr = syscall_arg(regs, 4);
            break;
        case __NR_writev:
            io.kind = IO_IOV;
            io.buf = syscall_arg(regs, 1);
            io.iovcnt = (__u32)syscall_arg(regs, 2);
            break;
        case __NR_sendmsg:
            io.kind = IO_MSG;
            io.buf = syscall_arg(regs, 1);
            break;
        case __NR_sendmmsg:
            vec = syscall_arg(regs, 1);
            io.buf = mmsg_entry((__u32)id, nr, vec);
            io.kind = io.buf ? IO_MSG : IO_UNKNOWN;
            if (!io.buf)
                count_stat(STAT_MMSG_UNKNOWN);
            break;
        case __NR_sendfile:
            io.kind = IO_SENDFILE;
            break;
        case __NR_splice:
            io.kind = IO_SENDFILE; /* io.fd is fd_out (above) */
            break;
        default:
            return 0;
        }
#if HAVE_SK_DATA_READY
        /* The socket this send woke (sk_data_ready), and when. */
        int slot = 0;
        struct woken *woke = woken_sk.lookup(&slot);
        if (woke && woke->tid == (__u32)id) {
            /* within this send: a wake-up older than 1 ms was an interrupt's, not ours */
            if (woke->sk != sk && cls == SK_STREAM && io.ts - woke->ts < 1000000) {
                io.peer_sk = woke->sk;
                io.ts = woke->ts;
            }
            woke->tid = 0;
        }
#endif
    }
    if (cls == SK_STREAM)
        return emit_stream(id, &io, known);
    if (deferred) {
        /* The sender's address reaches user memory after sock_recvmsg
         * returns: keep this datagram for the syscall's exit. recvmmsg fires
         * once per entry, and entry k's address is in place when entry k+1
         * fires: the previous entry is emitted now, the last at the exit. */
        __u32 tid = (__u32)id;
        struct udp_pending *prev = udp_rx.lookup(&tid);
        int have_prev = prev && prev->nr == (__u32)nr && nr == __NR_recvmmsg;
        struct sock_io out = {};
        if (have_prev)
            out = prev->io;
        struct udp_pending pending = {};
        pending.io = io;
        pending.nr = (__u32)nr;
        if (udp_rx.update(&tid, &pending) != 0)
            count_stat(STAT_IO_MAP_FULL);
        if (!have_prev)
            return 0;
        io = out;
    }
    return emit_datagram(id, &io);
}

static __always_inline int on_sock_length(__u64 sk, __u16 family, __u16 protocol, int ret, int rflags, __u8 direction)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    return on_traced_sock_length(id, sk, family, protocol, ret, rflags, direction, 1);
}

#if SOCK_RAW_TP
/* Raw tracepoints: TP_PROTO(struct sock *sk, int ret, int flags), nothing
 * copied before the program runs. Filter first; only a traced process's
 * call gets to the socket's family and protocol (on_traced_sock_length). */

static __always_inline int sock_length_raw(struct bpf_raw_tracepoint_args *ctx, __u8 direction)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    int ret = (int)ctx->args[1];
    /* the classic path drops these too, after its filter: the only ret == 0
     * that matters is a receive's (Unix EOF), which needs the family */
    if (ret < 0 || (ret == 0 && direction == DIR_EGRESS))
        return 0;
    return on_traced_sock_length(id, (__u64)ctx->args[0], 0, 0, ret, (int)ctx->args[2], direction, 0);
}

RAW_TRACEPOINT_PROBE(sock_recv_length)
{
    int done = sock_length_raw(ctx, DIR_INGRESS);
#if PROPAGATION
    if (done == PROP_SCAN)
        prop_after_receive.call(ctx, 0);
#endif
    return 0;
}

RAW_TRACEPOINT_PROBE(sock_send_length)
{
    return sock_length_raw(ctx, DIR_EGRESS);
}

/* Start-up self-check of the offsets (not auto-attached: user space attaches
 * it to sock_send_length for a moment, sends datagrams of SK_CHECK_LEN + i
 * bytes on sockets whose family and protocol it knows, and compares). */
BPF_ARRAY(sk_check, __u32, 4);

int sk_offsets_check(struct bpf_raw_tracepoint_args *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    if ((__u32)(id >> 32) != AGENT_TGID)
        return 0;
    int slot = (int)ctx->args[1] - SK_CHECK_LEN;
    if (slot < 0 || slot >= 4)
        return 0;
    __u64 sk = (__u64)ctx->args[0];
    __u16 family = 0;
    __u16 protocol = 0;
    bpf_probe_read_kernel(&family, sizeof(family), (void *)(sk + SK_FAMILY_OFF));
    bpf_probe_read_kernel(&protocol, SK_PROTOCOL_SIZE, (void *)(sk + SK_PROTOCOL_OFF));
    __u32 seen = ((__u32)family << 16) | protocol;
    sk_check.update(&slot, &seen);
    return 0;
}
#else
/* Classic tracepoints (no BTF offsets): the kernel builds the trace record
 * (sk, family, protocol, ret, flags) before the program runs, for every
 * socket call on the host, traced or not. */
TRACEPOINT_PROBE(sock, sock_recv_length)
{
    int done = on_sock_length((__u64)args->sk, args->family, args->protocol, args->ret, args->flags, DIR_INGRESS);
#if PROPAGATION
    if (done == PROP_SCAN)
        prop_after_receive.call(args, 0);
#endif
    return 0;
}

TRACEPOINT_PROBE(sock, sock_send_length)
{
    return on_sock_length((__u64)args->sk, args->family, args->protocol, args->ret, args->flags, DIR_EGRESS);
}
#endif

#if HAVE_SK_DATA_READY
/* A local write wakes the receiving socket inside the writer's syscall,
 * before sock_send_length fires. For a Unix socket that names the other end
 * of the connection, which user space uses to pair a client with its
 * server; for any local socket it is the moment the receiver could start
 * reading, which stamps the send (see woken_sk). A raw tracepoint (it fires
 * for every segment any socket on the host receives, so it must be cheap):
 * filter the traced process, keep the last wake-up for the send that
 * follows (which deletes it; a receive deletes a stale one). */
RAW_TRACEPOINT_PROBE(sk_data_ready)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    int slot = 0;
    struct woken *woke = woken_sk.lookup(&slot);
    if (woke) { /* the last one wins: a connect() woke the listener before */
        woke->sk = (__u64)ctx->args[0];
        woke->ts = bpf_ktime_get_ns();
        woke->tid = (__u32)id;
    }
    return 0;
}
#endif

/* ---- UDP: per-syscall tracepoints, attached only with CAPTURE_UDP ---- */

#if CAPTURE_UDP
static __always_inline int on_mmsg_enter(__u64 vec, __u32 vlen, long nr)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    __u32 tid = (__u32)id;
    struct mmsg_state st = {.vec = vec, .vlen = vlen, .next = 0, .nr = (__u32)nr};
    mmsg_states.update(&tid, &st);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_sendmmsg)
{
    return on_mmsg_enter((__u64)args->mmsg, (__u32)args->vlen, __NR_sendmmsg);
}

TRACEPOINT_PROBE(syscalls, sys_enter_recvmmsg)
{
    return on_mmsg_enter((__u64)args->mmsg, (__u32)args->vlen, __NR_recvmmsg);
}

/* UDP receives with a sender address: the address is in user memory now.
 * Emits the datagram the sock_recv_length handler kept (the last one for
 * recvmmsg). */
static __always_inline int on_udp_recv_exit(long ret, long nr)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    __u32 tid = (__u32)id;
    struct udp_pending *found = udp_rx.lookup(&tid);
    if (!found)
        return 0;
    struct udp_pending pending = *found;
    udp_rx.delete(&tid);
    if (pending.nr != (__u32)nr || ret <= 0) /* ret: bytes, or datagrams for recvmmsg */
        return 0;
    if (nr == __NR_recvmmsg)
        mmsg_states.delete(&tid);
    return emit_datagram(id, &pending.io);
}

TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom)
{
    return on_udp_recv_exit(args->ret, __NR_recvfrom);
}

TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg)
{
    return on_udp_recv_exit(args->ret, __NR_recvmsg);
}

TRACEPOINT_PROBE(syscalls, sys_exit_recvmmsg)
{
    return on_udp_recv_exit(args->ret, __NR_recvmmsg);
}
#endif
