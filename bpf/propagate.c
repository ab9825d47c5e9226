/* Cross-node trace context (docs/cross-node.md). Included by capture.c after
 * tls.c; compiled only with PROPAGATION != 0 (`otelbpf run --propagation`).
 *
 * One agent runs per node and no agent talks to another: what joins their
 * traces must ride on the wire. The ids of a hop are fixed here, in the
 * kernel, at the moment the request is written, because user space learns
 * which request a thread serves a drain later (~10 ms), when the gateway has
 * long called downstream:
 *
 *   - a traced server's read that starts a request (the first read after its
 *     last write, or a read starting at a received option's byte) fixes the
 *     trace it serves: the context of a TCP option that came on that byte
 *     (PARSE_HDR_OPT_CB), else the request's traceparent header, else a
 *     fresh random trace id. The thread (served_threads) and its process
 *     (served_procs) remember it until the first write answers it;
 *   - a traced client's write that starts a request (tcp:tcp_sendmsg_locked,
 *     before any byte of it is queued: an HTTP/1 request line or an HTTP/2
 *     HEADERS frame, or a TLS write whose plaintext is one; only the first
 *     since the socket connected or last read) takes the trace of the one
 *     request its thread, else its process, serves (otelbpf.association's
 *     thread and process rules, mirrored), or a fresh one, and a fresh span
 *     id for its CLIENT span;
 *   - both are handed to user space in the EV_DATA record of that read or
 *     write (DF_TRACE_CTX, capture.h), or of the TLS call's plaintext, and
 *     user space adopts them: the SERVER span's trace (and parent), the
 *     CLIENT span's trace and span id.
 *
 * On the wire (PROPAGATION & PROP_TCP): a TCP option, byte for byte OBI's
 * (bpf/tpinjector/tp_options.h: kind 25, len 26 = trace id + span id for a
 * sampled context, len 27 with a flags byte for an unsampled one), written
 * by the kernel's own header-option hooks on the segment that starts the
 * request (seq == the request's first byte), and on its retransmits until
 * that byte is acknowledged: the kernel does the option space, MSS and
 * GSO/TSO accounting (HDR_OPT_LEN_CB reserves, also for tcp_current_mss, so
 * segments are sized for it; WRITE_HDR_OPT_CB stores). A server's socket
 * reads it back in PARSE_HDR_OPT_CB (segments with an unknown option only)
 * with the segment's sequence number, and the read whose first byte it is
 * adopts it; an option on any other byte (a read holding pipelined requests)
 * is dropped, counted: a wrong parent is worse than none.
 *
 * Which sockets: a cgroup sock_ops program sees every socket of its cgroup
 * (the root: the host). It touches only traced processes' sockets:
 * TCP_CONNECT_CB runs in the connecting process (is_traced first), and only
 * its sockets get WRITE_HDR_OPT and an entry in prop_socks; server sockets
 * get PARSE_UNKNOWN_HDR_OPT when they were accepted on a listening endpoint
 * of a traced process (TCP_LISTEN_CB, or user space for listeners older than
 * the agent: prop_listeners), or for every process with --all. Connections
 * older than the agent carry nothing (sock_ops flags are set at connect and
 * accept only).
 *
 * Where the kernel cannot know (an asyncio loop with several requests open,
 * a library writing from its own I/O thread, several HTTP/2 streams in one
 * write) the hop stays unjoined rather than guessed.
 */

#if PROPAGATION

/* OBI's TCP option (bpf/tpinjector/tp_options.h) */
#define OTEL_OPT_KIND 25
#define OTEL_OPT_LEGACY_LEN 26
#define OTEL_OPT_EXTENDED_LEN 27
#define W3C_SAMPLED 1

struct otel_tcp_option {
    __u8 kind;
    __u8 len;
    __u8 trace_id[16];
    __u8 span_id[8];
    __u8 flags; /* extended layout only */
};

#if !defined(TCP_WRITE_SEQ_OFF) || !defined(TCP_COPIED_SEQ_OFF)
#error "TCP_*_SEQ_OFF missing: otelbpf.sources.crossnode passes struct tcp_sock's offsets from BTF"
#endif

#define MY_TCP_CLOSE 7

/* How many bytes of a write are looked at for a request's start. */
#define SNIFF_BYTES 128
#define SNIFF_IOVECS 4

/* A client socket of a traced process (from TCP_CONNECT_CB until it closes). */
struct prop_sock {
    __u32 tgid;
    __u8 armed;   /* the next request start may carry a context: nothing written since connect or a read */
    __u8 pending; /* the option waits for its segment, or for that segment's ACK */
    __u8 report;  /* the context waits to go to user space with this write's record */
    __u8 sent;    /* the option went out at least once */
    __u32 seq;    /* the request's first byte */
    __u32 report_tid;
    struct trace_ctx ctx;
};
BPF_TABLE("lru_hash", __u64, struct prop_sock, prop_socks, 65536);

/* The last option a server socket received, until the read that starts at its byte. */
struct prop_rx {
    __u32 seq;
    __u32 pad;
    struct trace_ctx ctx;
};
BPF_TABLE("lru_hash", __u64, struct prop_rx, prop_rx_opts, 16384);

/* Listening endpoints of traced processes (struct endpoint_key of socket.c,
 * addr all zero for a wildcard listener): their accepted sockets parse options. */
BPF_TABLE("lru_hash", struct endpoint_key, __u32, prop_listeners, 4096);

/* What a thread (by tid) or a process (by tgid) serves: how many requests it
 * read and nobody answered yet, and the latest of them. `valid` drops when
 * that latest one is answered: then the one still open is unknown. A
 * process's entry is written by all its threads: `seq` (odd while written)
 * lets a reader tell a torn copy. */
struct served {
    __u32 seq;
    __s32 open;
    __u8 background; /* the thread called out while its process served nothing */
    __u8 valid;
    /* the latest request may carry a context the kernel did not read (its headers
     * not looked at yet, or naming one in another format): its calls carry none */
    __u8 unsure;
    __u8 pad;
    __u32 pad2;
    __u64 sk;
    struct trace_ctx ctx;
};
/* by tid, or by tgid | SERVED_PROCESS */
#define SERVED_PROCESS (1ULL << 32)
BPF_TABLE("lru_hash", __u64, struct served, served, 32768);

/* TLS: the context of a socket read or write made inside (or, memory BIOs,
 * before) an SSL call, for that call's plaintext record (bpf/tls.c). */
struct prop_tls {
    __u64 conn_id;
    struct trace_ctx ctx;
};
/* by tid | direction << 32 */
BPF_TABLE("lru_hash", __u64, struct prop_tls, prop_tls, 16384);

/* Off the 512-byte stack the socket programs share (and few maps: a program
 * may use 64): a zeroed entry to insert (never written), and per-CPU room for
 * a found header, a TLS stash and where a header scan stopped. */
struct prop_scratch {
    struct served zero;
    struct trace_ctx found;
    struct prop_tls stash;
    __u32 found_at;
    __u32 found_kind;
    __u32 option_at; /* served_read_begin: where in the read the option's byte is */
    /* a header scan asked of prop_header_scan: by this thread, of this socket's read */
    __u32 scan_tid;
    __u64 scan_sk;
    __u64 scan_len;
    __u64 scanned_len; /* find_traceparent's, read back after its loop */
};
BPF_PERCPU_ARRAY(prop_scratches, struct prop_scratch, 1);

struct sniff_buf {
    __u8 b[SNIFF_BYTES * 4]; /* room for the verifier's bounds: an offset < SNIFF_BYTES plus a copy < 2 * SNIFF_BYTES */
};
BPF_PERCPU_ARRAY(prop_sniff, struct sniff_buf, 1);

/* var &= mask, kept by the compiler (which may know the mask changes nothing)
 * so that the verifier, which may not, sees the bound. */
#define MASK_FOR_VERIFIER(var, mask)            \
    do {                                        \
        asm volatile("" : "+r"(var));           \
        (var) &= (mask);                        \
    } while (0)

/* ---- ids ---- */

static __always_inline void random_id(__u8 *out, int words)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (i < words) {
            __u32 r = bpf_get_prandom_u32();
            __builtin_memcpy(out + 4 * i, &r, 4);
        }
    }
    out[0] |= out[0] ? 0 : 1; /* never all zero (W3C: invalid) */
}

static __always_inline void fresh_trace(struct trace_ctx *ctx)
{
    __builtin_memset(ctx, 0, sizeof(*ctx));
    random_id(ctx->trace_id, 4);
    ctx->flags = W3C_SAMPLED;
    ctx->origin = CTX_FRESH;
}

/* seq a is before seq b (wrapping) */
static __always_inline int seq_before(__u32 a, __u32 b)
{
    return (__s32)(a - b) < 0;
}

static __always_inline __u32 read_tcp_u32(__u64 sk, __u32 off)
{
    __u32 value = 0;
    bpf_probe_read_kernel(&value, sizeof(value), (void *)(sk + off));
    return value;
}

/* ---- what a thread and its process serve ---- */

static __always_inline void served_store(struct served *s, __u64 sk, struct trace_ctx *ctx, __u8 unsure)
{
    __sync_fetch_and_add(&s->seq, 1);
    s->sk = sk;
    __builtin_memcpy(&s->ctx, ctx, sizeof(*ctx));
    s->unsure = unsure;
    s->valid = 1;
    __sync_fetch_and_add(&s->seq, 1);
}

#define SERVED_NONE 0   /* the open request is not known */
#define SERVED_KNOWN 1  /* out: its context */
#define SERVED_UNSURE 2 /* known, but it may carry a context the kernel did not read */

/* The latest request's context, if it is the one open: SERVED_*. */
static __always_inline int served_take(struct served *s, struct trace_ctx *out)
{
    __u32 before = *(volatile __u32 *)&s->seq;
    if (before & 1 || !s->valid)
        return SERVED_NONE;
    __builtin_memcpy(out, &s->ctx, sizeof(*out));
    __u8 unsure = s->unsure;
    asm volatile("" ::: "memory");
    if (*(volatile __u32 *)&s->seq != before)
        return SERVED_NONE;
    return unsure ? SERVED_UNSURE : SERVED_KNOWN;
}

/* A thread's (a process's) entry, made (zeroed) if missing. */
static __always_inline struct served *served_of(__u64 key)
{
    return served.lookup(&key);
}

/* A thread's (tid) or a process's (tgid | SERVED_PROCESS) entry, made if missing. */
static __always_inline struct served *served_made(__u64 key)
{
    struct served *s = served.lookup(&key);
    if (s)
        return s;
    int zero = 0;
    struct prop_scratch *scratch = prop_scratches.lookup(&zero);
    if (!scratch)
        return 0;
    served.insert(&key, &scratch->zero);
    return served.lookup(&key);
}

/* The request read on `sk` (by `reader`) is answered, or its connection over. */
static __always_inline void served_close(__u32 tgid, __u32 reader, __u64 sk)
{
    struct served *t = served_of(reader);
    if (t) {
        if (t->open > 0)
            __sync_fetch_and_add(&t->open, -1);
        if (t->sk == sk)
            t->valid = 0;
    }
    struct served *p = served_of(tgid | SERVED_PROCESS);
    if (p) {
        if (p->open > 0)
            __sync_fetch_and_add(&p->open, -1);
        if (p->sk == sk) {
            __sync_fetch_and_add(&p->seq, 1);
            p->valid = 0;
            __sync_fetch_and_add(&p->seq, 1);
        }
    }
}

/* A connection's entry is going (closed, fd reused, Unix EOF): an open request on it is over. */
static __always_inline void prop_connection_over(__u32 tgid, struct conn_val *entry)
{
    if (entry->prop & PROP_OPEN) {
        entry->prop &= ~PROP_OPEN;
        served_close(tgid, entry->reader_tid, entry->sk);
    }
}

/* The trace a request written now by thread `tid` belongs to (the linker's
 * thread rule, then its process rule, else a new trace); 0 when the kernel
 * cannot tell and user space may (an asyncio loop serving several requests:
 * its task rule decides later), so nothing goes on the wire. */
static __always_inline int client_trace(__u32 tgid, __u32 tid, __u8 uses, struct trace_ctx *ctx)
{
    struct served *t = served_of(tid);
    if (t && t->open > 0) {
        int taken = t->open == 1 ? served_take(t, ctx) : SERVED_NONE;
        if (taken == SERVED_UNSURE)
            return 0;
        if (taken == SERVED_KNOWN) {
            ctx->rule = CTX_RULE_THREAD;
            return 1;
        }
        if (uses & USES_TASKS)
            return 0;
        fresh_trace(ctx); /* several open (or the open one unknown): the linker leaves it a root */
        return 1;
    }
    struct served *p = served_of(tgid | SERVED_PROCESS);
    if (t && t->background) {
        fresh_trace(ctx);
        return 1;
    }
    if (p && p->open > 0) {
        int taken = p->open == 1 ? served_take(p, ctx) : SERVED_NONE;
        if (taken == SERVED_UNSURE)
            return 0;
        if (taken == SERVED_KNOWN) {
            ctx->rule = CTX_RULE_PROCESS;
            return 1;
        }
        if (uses & USES_TASKS)
            return 0;
        fresh_trace(ctx);
        return 1;
    }
    /* the process serves nothing: this thread calls out on its own (the linker's background thread) */
    t = served_made(tid);
    if (t)
        t->background = 1;
    fresh_trace(ctx);
    return 1;
}

/* ---- a request's first bytes ---- */

static __always_inline int is_http1_request(__u8 *b)
{
    /* GET POST PUT HEAD PATCH DELETE OPTIONS, then a space */
    if (b[0] == 'G' && b[1] == 'E' && b[2] == 'T' && b[3] == ' ')
        return 1;
    if (b[0] == 'P' && b[1] == 'U' && b[2] == 'T' && b[3] == ' ')
        return 1;
    if (b[0] == 'P' && b[1] == 'O' && b[2] == 'S' && b[3] == 'T' && b[4] == ' ')
        return 1;
    if (b[0] == 'H' && b[1] == 'E' && b[2] == 'A' && b[3] == 'D' && b[4] == ' ')
        return 1;
    if (b[0] == 'P' && b[1] == 'A' && b[2] == 'T' && b[3] == 'C' && b[4] == 'H' && b[5] == ' ')
        return 1;
    if (b[0] == 'D' && b[1] == 'E' && b[2] == 'L' && b[3] == 'E' && b[4] == 'T' && b[5] == 'E' && b[6] == ' ')
        return 1;
    if (b[0] == 'O' && b[1] == 'P' && b[2] == 'T' && b[3] == 'I' && b[4] == 'O' && b[5] == 'N' && b[6] == 'S')
        return 1;
    return 0;
}

/* An HTTP/2 client's write that opens a stream: a HEADERS frame on an odd
 * stream id among its first frames (after the connection preface, SETTINGS,
 * WINDOW_UPDATE, PING...). */
static __always_inline int h2_opens_stream(__u8 *b, __u32 n)
{
    __u64 off = 0;
    if (b[0] == 'P' && b[1] == 'R' && b[2] == 'I' && b[3] == ' ')
        off = 24;
#pragma unroll
    for (int i = 0; i < 6; i++) {
        if (off > SNIFF_BYTES - 9 || off + 9 > n)
            return 0;
        __u64 at = off;
        MASK_FOR_VERIFIER(at, SNIFF_BYTES - 1); /* off < SNIFF_BYTES: the mask only shows the verifier */
        __u8 *f = b + at;
        __u32 len = ((__u32)f[0] << 16) | ((__u32)f[1] << 8) | f[2];
        __u8 type = f[3];
        __u8 stream_low = f[8];
        if (f[0] > 0 || len > 16384) /* bigger than the default frame size: not a frame header */
            return 0;
        if (type == 1 && (stream_low & 1))
            return 1;
        if (type > 9)
            return 0;
        off += 9 + len;
    }
    return 0;
}

/* Copy up to SNIFF_BYTES of the current send syscall's payload (the user's
 * buffers, from the saved registers) into out; returns how many. */
static __always_inline __u32 sniff_payload(void *regs, long nr, __u8 *out)
{
    __u64 len = 0;
    if (nr == __NR_write || nr == __NR_sendto) {
        len = syscall_arg(regs, 2);
        if (len > SNIFF_BYTES)
            len = SNIFF_BYTES;
        BOUND_FOR_VERIFIER(len, SNIFF_BYTES);
        if (bpf_probe_read_user(out, len, (void *)syscall_arg(regs, 1)) != 0)
            return 0;
        return len;
    }
    __u64 iov_ptr = 0, iovcnt = 0;
    if (nr == __NR_writev) {
        iov_ptr = syscall_arg(regs, 1);
        iovcnt = syscall_arg(regs, 2);
    } else if (nr == __NR_sendmsg) {
        struct msghdr_user msg = {};
        if (bpf_probe_read_user(&msg, sizeof(msg), (void *)syscall_arg(regs, 1)) != 0)
            return 0;
        iov_ptr = msg.iov;
        iovcnt = msg.iovlen;
    } else {
        return 0;
    }
    __u32 got = 0;
#pragma unroll
    for (int i = 0; i < SNIFF_IOVECS; i++) {
        if (i >= iovcnt || got >= SNIFF_BYTES)
            break;
        struct iovec_user iov = {};
        if (bpf_probe_read_user(&iov, sizeof(iov), (void *)(iov_ptr + i * sizeof(iov))) != 0)
            break;
        __u64 take = iov.len < SNIFF_BYTES - got ? iov.len : SNIFF_BYTES - got;
        /* the masks change nothing (got < SNIFF_BYTES, take <= SNIFF_BYTES) but show the verifier the bounds */
        __u32 at = got;
        MASK_FOR_VERIFIER(at, SNIFF_BYTES - 1);
        MASK_FOR_VERIFIER(take, 2 * SNIFF_BYTES - 1);
        if (take && bpf_probe_read_user(out + at, take, (void *)iov.base) != 0)
            break;
        got = at + take;
    }
    return got;
}

static __always_inline int starts_request(__u8 *b, __u32 n)
{
    if (n >= 8 && is_http1_request(b))
        return 1;
    return n >= 9 && h2_opens_stream(b, n);
}

/* Is the plaintext of an SSL write at `buf` (`len` bytes) a request's start? (bpf/tls.c) */
static __always_inline int prop_tls_write_starts_request(__u64 buf, __u64 len)
{
    int zero = 0;
    struct sniff_buf *buf_ = prop_sniff.lookup(&zero);
    if (!buf_)
        return 0;
    __u8 *out = buf_->b;
    if (len > SNIFF_BYTES)
        len = SNIFF_BYTES;
    BOUND_FOR_VERIFIER(len, SNIFF_BYTES);
    if (len < 8 || bpf_probe_read_user(out, len, (void *)buf) != 0)
        return 0;
    return starts_request(out, len);
}

/* ---- client: a request starts (before any of it is queued) ---- */

RAW_TRACEPOINT_PROBE(tcp_sendmsg_locked)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    if (!is_traced(tgid))
        return 0;
    __u64 sk = ctx->args[0];
    struct prop_sock *ps = prop_socks.lookup(&sk);
    if (!ps || !ps->armed)
        return 0;
    void *regs = current_user_regs();
    long nr = current_syscall_nr(regs);
    __u32 tid = (__u32)id;
    __u8 uses = process_uses(tgid);
    /* whose bytes: a connection user space gave up on (muted) gets nothing,
     * its CLIENT span would not exist to be a parent */
    struct conn_key key = {.tgid = tgid, .fd = (int)syscall_arg(regs, 0)};
    struct conn_val *known = conns.lookup(&key);
    __u8 muted = known && known->sk == sk ? known->muted : 0;
    int via_tls = 0;
    int request = 0;
    int zero = 0;
    struct sniff_buf *sniffed = prop_sniff.lookup(&zero);
    if (!sniffed)
        return 0;
    __u8 *sniff = sniffed->b;
    if (!(muted & (1 << SOURCE_SOCKET))) {
        __u32 n = sniff_payload(regs, nr, sniff);
        request = starts_request(sniff, n);
    }
#if CAPTURE_TLS
    if (!request && (uses & USES_TLS)) {
        struct tls_call *call = tls_calls.lookup(&tid);
        if (call && call->direction == DIR_EGRESS && call->starts_request && !(muted & (1 << SOURCE_TLS))) {
            call->starts_request = 0;
            request = 1;
            via_tls = 1;
        }
    }
#endif
    if (!request)
        return 0;
    ps->armed = 0;
    struct trace_ctx chosen = {};
    if (!client_trace(tgid, tid, uses, &chosen))
        return 0;
    random_id(chosen.span_id, 2);
    chosen.origin = CTX_CLIENT;
    chosen.carriers = (PROPAGATION & PROP_TCP) ? CARRIER_TCP_OPTION : 0;
    __builtin_memcpy(&ps->ctx, &chosen, sizeof(chosen));
    ps->seq = read_tcp_u32(sk, TCP_WRITE_SEQ_OFF);
    ps->pending = (PROPAGATION & PROP_TCP) ? 1 : 0;
    ps->sent = 0;
    ps->report_tid = tid;
    ps->report = !via_tls;
    if (via_tls) {
        struct prop_tls stash = {.conn_id = known ? known->conn_id : 0};
        __builtin_memcpy(&stash.ctx, &chosen, sizeof(chosen));
        __u64 key = tid | ((__u64)DIR_EGRESS << 32);
        prop_tls.update(&key, &stash);
    }
    return 0;
}

/* ---- the socket path's hooks (bpf/socket.c) ---- */

/* A request read on a server's end: the option that came on its first byte, if any. */
static __always_inline int served_read_begin(__u64 id, struct sock_io *io, struct conn_val *entry, struct trace_ctx *ctx)
{
#if PROPAGATION & PROP_TCP
    if (io->protocol == MY_IPPROTO_TCP) {
        __u64 sk = io->sk;
        struct prop_rx *rx = prop_rx_opts.lookup(&sk);
        if (rx) {
            __u32 end = read_tcp_u32(sk, TCP_COPIED_SEQ_OFF);
            __u32 start = end - io->total;
            if (rx->seq == start) {
                __builtin_memcpy(ctx, &rx->ctx, sizeof(*ctx));
                prop_rx_opts.delete(&sk);
                count_stat(STAT_CTX_ADOPTED);
                entry->prop |= PROP_CARRIED;
                return PROP_IO_SERVED;
            }
            if (seq_before(rx->seq, start)) {
                prop_rx_opts.delete(&sk); /* its byte came in an earlier read: not placed */
                count_stat(STAT_CTX_UNPLACED);
            } else if (seq_before(rx->seq, end)) {
                /* inside this read, after bytes of earlier writes: placed if those hold no
                 * request (prop_served_commit looks at them) */
                __builtin_memcpy(ctx, &rx->ctx, sizeof(*ctx));
                int zero = 0;
                struct prop_scratch *scratch = prop_scratches.lookup(&zero);
                if (scratch)
                    scratch->option_at = rx->seq - start;
                prop_rx_opts.delete(&sk);
                return PROP_IO_MAYBE;
            }
        }
    }
#endif
    if (entry->prop & PROP_OPEN)
        return 0; /* more of the request that is open */
    fresh_trace(ctx);
    return PROP_IO_SERVED;
}

/* Do the first `before` bytes of a read (data, captured) hold HTTP/2 frames
 * that open no stream, ending exactly there? Then a request that starts after
 * them, at the option's byte, is the read's first (the connection preface and
 * SETTINGS of a new channel, then its first call, read at once). */
static __always_inline int h2_prefix_opens_nothing(__u8 *data, __u64 captured, __u32 before)
{
    if (before > captured || captured < 9)
        return 0;
    __u32 off = 0;
    if (data[0] == 'P' && data[1] == 'R' && data[2] == 'I' && data[3] == ' ')
        off = 24;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (off == before)
            return 1;
        if (off > before || off + 9 > captured)
            return 0;
        __u8 f[9] = {};
        /* a copy: the offset grows with the frames, past what the verifier can bound in place */
        if (bpf_probe_read_kernel(f, sizeof(f), data + off) != 0)
            return 0;
        if (f[0] || f[3] > 9 || (f[3] == 1 && (f[8] & 1)))
            return 0; /* not a frame header (too big for the default size), or a stream opening */
        off += 9 + (((__u32)f[1] << 8) | f[2]);
    }
    return 0;
}

/* Every stream I/O of a traced thread on a connection with a side, also when
 * user space muted it: the served requests' bookkeeping, the client's
 * re-arming and report. Returns PROP_IO_* (0: nothing for the record). */
static __always_inline int prop_stream_io(__u64 id, struct sock_io *io, struct conn_val *entry, struct trace_ctx *ctx)
{
    __u8 side = entry->prop;
    if (io->direction == DIR_INGRESS) {
        if (side & PROP_CALLS) {
            __u64 sk = io->sk;
            struct prop_sock *ps = prop_socks.lookup(&sk);
            if (ps)
                ps->armed = 1; /* its answer: the next request may start */
            return 0;
        }
        if (side & PROP_SERVES)
            return served_read_begin(id, io, entry, ctx);
        return 0;
    }
    if (side & PROP_SERVES) {
        prop_connection_over(id >> 32, entry); /* answered */
        return 0;
    }
    if (side & PROP_CALLS) {
        __u64 sk = io->sk;
        struct prop_sock *ps = prop_socks.lookup(&sk);
        if (ps && ps->report && ps->report_tid == (__u32)id) {
            ps->report = 0;
            __builtin_memcpy(ctx, &ps->ctx, sizeof(*ctx));
            return PROP_IO_REPORT;
        }
    }
    return 0;
}

/* The value of the hex digit pair at b, without a branch (a non-hex
 * character gives some value: user space, which parses the header with the
 * official propagator, then leaves the kernel's trace alone, see below). */
static __always_inline __u8 hex_pair(__u8 *b)
{
    __u8 hi = b[0], lo = b[1];
    return (((hi & 0xf) + 9 * (hi >> 6)) << 4) | ((lo & 0xf) + 9 * (lo >> 6));
}

/* Parse `00-<32 hex>-<16 hex>-<2 hex>` at b into ctx: 1 when its dashes and
 * version are right. The digits are not checked one by one (a branch each
 * weighed too much on the verifier): a header whose ids are not hex is
 * refused by user space's propagator, and the request's SERVER span then
 * keeps the fresh trace its record came with, while a call under it takes
 * this one: that hop stays unjoined, nothing worse. */
static __always_inline int parse_traceparent(__u8 *b, struct trace_ctx *ctx)
{
    if (b[0] != '0' || b[1] != '0' || b[2] != '-' || b[35] != '-' || b[52] != '-')
        return 0;
#pragma unroll
    for (int i = 0; i < 16; i++)
        ctx->trace_id[i] = hex_pair(&b[3 + 2 * i]);
#pragma unroll
    for (int i = 0; i < 8; i++)
        ctx->span_id[i] = hex_pair(&b[36 + 2 * i]);
    ctx->flags = hex_pair(&b[53]);
    ctx->origin = CTX_HEADER;
    __u64 trace_lo = 0, trace_hi = 0, span = 0;
    __builtin_memcpy(&trace_lo, ctx->trace_id, 8);
    __builtin_memcpy(&trace_hi, ctx->trace_id + 8, 8);
    __builtin_memcpy(&span, ctx->span_id, 8);
    return (trace_lo | trace_hi) && span; /* all-zero ids are invalid (W3C) */
}

/* The header block of a plaintext HTTP/1 request in data: the value of its
 * traceparent field into ctx (1), else 0. Bounded (the first TP_SCAN_BYTES
 * bytes, the headers only) and word by word: eight bytes at a time are
 * searched for a line starting with 't' or 'T' (a '\n' followed by it), with
 * no branch for the words that hold none, so that the loop costs the traced
 * thread ~30 instructions per 8 bytes and the verifier one pass per word. */
#ifndef TP_SCAN_BYTES
#define TP_SCAN_BYTES (CAPTURE_BYTES < 1104 ? CAPTURE_BYTES - 80 : 1024)
#endif
#define TP_VALUE_LEN 55
#define BYTES_OF(c) (0x0101010101010101ULL * (c))
/* what find_traceparent found */
#define FOUND_TRACEPARENT 1 /* a traceparent: ctx */
#define FOUND_OTHER 2       /* a context the kernel does not read (Jaeger, B3), or a malformed traceparent */

/* Bit 7 of each byte of x that is zero (exactly: no false positives). */
static __always_inline __u64 zero_bytes(__u64 x)
{
    __u64 low7 = BYTES_OF(0x7f);
    return ~(((x & low7) + low7) | x | low7);
}

/* The index (0..7) of the byte whose bit 7 is the lowest bit set in bits (not 0):
 * the number of bits below it (8 * index + 7), counted without branches. */
static __always_inline __u32 lowest_byte(__u64 bits)
{
    __u64 below = (bits & -bits) - 1;
    below = below - ((below >> 1) & BYTES_OF(0x55));
    below = (below & BYTES_OF(0x33)) + ((below >> 2) & BYTES_OF(0x33));
    below = (below + (below >> 4)) & BYTES_OF(0x0f);
    return ((below * BYTES_OF(1)) >> 59) & 7;
}

static __always_inline int find_traceparent(__u8 *data, __u64 captured, struct trace_ctx *ctx)
{
#if CAPTURE_BYTES >= 256
    int zero = 0;
    struct prop_scratch *scratch = prop_scratches.lookup(&zero);
    if (!scratch || captured < 16 || !is_http1_request(data))
        return 0;
    __u32 *found = &scratch->found_at;
    *found = 0;
    scratch->found_kind = 0;
    scratch->scanned_len = captured;
    for (int w = 0; w < TP_SCAN_BYTES / 8; w++) {
        __u32 off = w * 8;
        if (off + 16 > captured)
            break;
        __u64 here = *(__u64 *)(data + off);
        __u64 next = *(__u64 *)(data + off + 8);
        __u64 after = (here >> 8) | (next << 56); /* byte k: the one after byte k of here */
        __u64 newline = zero_bytes(here ^ BYTES_OF('\n'));
        __u64 lead = after | BYTES_OF(0x20); /* lower case */
        __u64 letters = zero_bytes(lead ^ BYTES_OF('t')) | zero_bytes(lead ^ BYTES_OF('u')) |
                        zero_bytes(lead ^ BYTES_OF('b')) | zero_bytes(lead ^ BYTES_OF('x'));
        __u64 blank = zero_bytes(after ^ BYTES_OF('\r')) | zero_bytes(after ^ BYTES_OF('\n'));
        __u64 candidates = newline & letters;
        if (candidates) { /* rare: a line starting with t, u, b or x (traceparent, uber-trace-id, b3, x-b3-*) */
#pragma unroll
            for (int round = 0; round < 2; round++) {
                __u32 at = off + 1 + lowest_byte(candidates); /* the line's first letter */
                __u64 name = *(__u64 *)(data + at) | BYTES_OF(0x20);
                __u32 tail = *(__u32 *)(data + at + 8) | 0x20202020;
                if (name == 0x7261706563617274ULL && tail == 0x3a746e65) { /* "tracepar" "ent:" */
                    *found = at + 12 + (data[at + 12] == ' ');
                    scratch->found_kind = FOUND_TRACEPARENT;
                    break;
                }
                if ((name == 0x6172742d72656275ULL && tail == 0x692d6563) || /* "uber-tra" "ce-i" */
                    (name & 0xffffff) == 0x3a3362 ||                        /* "b3:" */
                    (name & 0xffffffffffULL) == 0x2d33622d78ULL) {          /* "x-b3-" */
                    scratch->found_kind = FOUND_OTHER;
                    break;
                }
                candidates &= candidates - 1;
                if (!candidates)
                    break;
            }
            if (*found || scratch->found_kind)
                break;
        }
        if (newline & blank)
            break; /* the headers end in this word */
    }
    /* read back from the map: the verifier continues with one state, not one per exit */
    if (scratch->found_kind == FOUND_OTHER)
        return FOUND_OTHER;
    __u32 at = *found;
    captured = scratch->scanned_len;
    if (!at || at + TP_VALUE_LEN > captured)
        return 0;
    /* at <= TP_SCAN_BYTES + 22 < the mask + 1, and the value fits the record's 2 * CAPTURE_BYTES */
    MASK_FOR_VERIFIER(at, CAPTURE_BYTES >= 2048 ? 2047 : CAPTURE_BYTES - 1);
    return parse_traceparent(&data[at], ctx) ? FOUND_TRACEPARENT : FOUND_OTHER;
#else
    return 0;
#endif
}

/* A served request starts (served_read_begin chose ctx): the thread's and the
 * process's served state take it. In a plaintext HTTP/1 request, a header may
 * carry a context of its own (an instrumented client's, a peer's header mode),
 * which wins, as it does in user space: in a process that calls out, the
 * receive tracepoint then tail-calls prop_header_scan on the payload this read
 * left in the per-CPU scratch record (PROP_SCAN returned; a program of its
 * own: the scan's loop, verified inside the capture's many paths, went past
 * the verifier's 1M instructions). A request of a process that never called
 * out is not scanned: if it calls out while serving it (its first call), the
 * kernel does not know the trace, and that call carries no context. */
static __always_inline int prop_served_commit(__u64 id, struct sock_io *io, struct conn_val *entry,
                                              struct trace_ctx *ctx, __u8 *data, __u64 captured, int how)
{
    __u32 tgid = id >> 32;
    __u32 tid = (__u32)id;
    int zero = 0;
    struct prop_scratch *scratch = prop_scratches.lookup(&zero);
    if (!scratch)
        return 0;
    if (how == PROP_IO_MAYBE) {
        if (data && h2_prefix_opens_nothing(data, captured, scratch->option_at)) {
            count_stat(STAT_CTX_ADOPTED);
            entry->prop |= PROP_CARRIED;
        } else {
            count_stat(STAT_CTX_UNPLACED); /* which request it was for is unknown */
            if (entry->prop & PROP_OPEN)
                return 0;
            fresh_trace(ctx);
        }
    }
    int http1 = data && captured >= 8 && is_http1_request(data);
    if (http1 && ctx->origin == CTX_FRESH && (entry->prop & PROP_CARRIED))
        count_stat(STAT_CTX_MISSING); /* its connection carried contexts before: stripped on the way? */
    __u8 unsure = 0;
    int done = PROP_HAS_CTX;
    if (http1) {
        if (process_uses(tgid) & USES_CALLS) {
            scratch->scan_tid = tid;
            scratch->scan_sk = io->sk;
            scratch->scan_len = captured;
            done |= PROP_SCAN;
        } else {
            unsure = 1;
        }
    }
    if (!(entry->prop & PROP_OPEN)) {
        entry->prop |= PROP_OPEN;
        entry->reader_tid = tid;
        struct served *t = served_made(tid);
        if (t)
            __sync_fetch_and_add(&t->open, 1);
        struct served *p = served_made(tgid | SERVED_PROCESS);
        if (p)
            __sync_fetch_and_add(&p->open, 1);
    }
    struct served *t = served_of(tid);
    if (t)
        served_store(t, io->sk, ctx, unsure);
    struct served *p = served_of(tgid | SERVED_PROCESS);
    if (p)
        served_store(p, io->sk, ctx, unsure);
    if (io->uses & USES_TLS) { /* the plaintext record of the SSL_read that reads it carries it (bpf/tls.c) */
        scratch->stash.conn_id = entry->conn_id;
        __builtin_memcpy(&scratch->stash.ctx, ctx, sizeof(*ctx));
        __u64 key = tid | ((__u64)DIR_INGRESS << 32);
        prop_tls.update(&key, &scratch->stash);
    }
    return done;
}

/* Tail-called by the receive tracepoint after the capture (socket.c,
 * prop_after_receive): the trace-context header of a request
 * prop_served_commit asked about, in the payload the capture left in the
 * per-CPU scratch record. A traceparent: the thread's and process's served
 * state take it (if the request is still the one they hold). The record
 * already went out with the context of the option or a fresh one; user
 * space, which parses the header too, gives it precedence as the kernel now
 * does. A context in another format (Jaeger, B3): the kernel does not read
 * it, so the calls made while serving this request carry none. */
static __always_inline int header_scan(void)
{
    int zero = 0;
    struct prop_scratch *work = prop_scratches.lookup(&zero);
    if (!work)
        return 0;
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    if (!work->scan_tid || work->scan_tid != tid)
        return 0;
    work->scan_tid = 0;
    struct data_record *rec = scratch.lookup(&zero);
    if (!rec)
        return 0;
    __builtin_memset(&work->found, 0, sizeof(work->found));
    __u64 captured = work->scan_len;
    BOUND_FOR_VERIFIER(captured, CAPTURE_BYTES);
    int found = find_traceparent(rec->data, captured, &work->found);
    if (!found)
        return 0;
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u64 sk = work->scan_sk;
    struct served *t = served_of(tid);
    struct served *p = served_of(tgid | SERVED_PROCESS);
    if (found == FOUND_TRACEPARENT) {
        if (t && t->sk == sk && t->valid)
            served_store(t, sk, &work->found, 0);
        if (p && p->sk == sk && p->valid)
            served_store(p, sk, &work->found, 0);
    } else { /* a context in a format the kernel does not read: its calls carry none */
        if (t && t->sk == sk)
            t->unsure = 1;
        if (p && p->sk == sk)
            p->unsure = 1;
    }
    return 0;
}

#if SOCK_RAW_TP
int prop_header_scan(struct bpf_raw_tracepoint_args *ctx)
{
    return header_scan();
}
#else
int prop_header_scan(void *ctx)
{
    return header_scan();
}
#endif

/* bpf/tls.c, at an SSL call's return: the context of the socket I/O made for
 * it, when on its connection (then it is handed over once). */
static __always_inline int prop_tls_take(__u32 tid, __u8 direction, __u64 conn_id, struct trace_ctx *ctx)
{
    __u64 key = tid | ((__u64)direction << 32);
    struct prop_tls *stash = prop_tls.lookup(&key);
    if (!stash)
        return 0;
    int mine = stash->conn_id == conn_id;
    if (mine)
        __builtin_memcpy(ctx, &stash->ctx, sizeof(*ctx));
    prop_tls.delete(&key);
    return mine;
}

/* bpf/proc.c: a traced thread (and, group_dead, its process) exited. */
static __always_inline void prop_task_exit(__u32 tgid, __u32 tid, int group_dead)
{
    __u64 key = tid;
    served.delete(&key);
    key = tid | ((__u64)DIR_INGRESS << 32);
    prop_tls.delete(&key);
    key = tid | ((__u64)DIR_EGRESS << 32);
    prop_tls.delete(&key);
    if (group_dead) {
        key = tgid | SERVED_PROCESS;
        served.delete(&key);
    }
}

/* ---- the cgroup sock_ops program: flags, the option on the wire ---- */

static __always_inline void set_cb_flags(struct bpf_sock_ops *skops, __u32 flags)
{
    bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | flags);
}

static __always_inline void endpoint_of_listener(struct bpf_sock_ops *skops, struct endpoint_key *key, int wildcard)
{
    __builtin_memset(key, 0, sizeof(*key));
    key->family = skops->family;
    key->port = skops->local_port; /* host order */
    if (wildcard)
        return;
    if (skops->family == MY_AF_INET) {
        __u32 addr = skops->local_ip4;
        __builtin_memcpy(key->addr, &addr, 4);
    } else {
        __u32 addr[4] = {skops->local_ip6[0], skops->local_ip6[1], skops->local_ip6[2], skops->local_ip6[3]};
        __builtin_memcpy(key->addr, addr, 16);
    }
}

/* Was this accepted socket's endpoint listened on by a traced process? */
static __always_inline int traced_listener(struct bpf_sock_ops *skops)
{
#if TRACE_MODE == MODE_ALL
    return 1;
#else
    struct endpoint_key key;
    endpoint_of_listener(skops, &key, 0);
    if (prop_listeners.lookup(&key))
        return 1;
    endpoint_of_listener(skops, &key, 1);
    if (prop_listeners.lookup(&key))
        return 1;
    if (skops->family == MY_AF_INET6) { /* a v4-mapped connection to a dual-stack listener, or v4 to [::] */
        key.family = MY_AF_INET;
        if (prop_listeners.lookup(&key))
            return 1;
    }
    return 0;
#endif
}

#if PROPAGATION & PROP_TCP
/* HDR_OPT_LEN_CB: room for the option in the segment being built (or, with
 * no skb, in tcp_current_mss: the MSS shrinks while one is pending). */
static __always_inline void option_room(struct bpf_sock_ops *skops, struct prop_sock *ps)
{
    if (seq_before(ps->seq, skops->snd_una)) {
        ps->pending = 0; /* its segment is acknowledged */
        return;
    }
    if (!(skops->args[0] & BPF_WRITE_HDR_TCP_CURRENT_MSS)) {
        if (skops->skb_len == 0)
            return; /* a pure ACK */
        __u32 next = skops->snd_nxt;
        /* new data from the request's byte, or a retransmit of what was sent */
        if (next != ps->seq && !seq_before(ps->seq, next))
            return;
    }
    __u32 len = ps->ctx.flags & W3C_SAMPLED ? OTEL_OPT_LEGACY_LEN : OTEL_OPT_EXTENDED_LEN;
    bpf_reserve_hdr_opt(skops, len, 0);
}

/* WRITE_HDR_OPT_CB: the option, on the segment starting at the request's byte. */
static __always_inline void option_write(struct bpf_sock_ops *skops, struct prop_sock *ps)
{
    void *data = (void *)(long)skops->skb_data;
    void *end = (void *)(long)skops->skb_data_end;
    if (data + 20 > end)
        return;
    __u32 seq = bpf_ntohl(*(__u32 *)(data + 4));
    __u8 doff = (*(__u8 *)(data + 12)) >> 4;
    if (seq != ps->seq || skops->skb_len <= (__u32)doff * 4)
        return;
    struct otel_tcp_option opt = {};
    opt.kind = OTEL_OPT_KIND;
    __builtin_memcpy(opt.trace_id, ps->ctx.trace_id, 16);
    __builtin_memcpy(opt.span_id, ps->ctx.span_id, 8);
    long ret;
    if (ps->ctx.flags & W3C_SAMPLED) {
        opt.len = OTEL_OPT_LEGACY_LEN;
        ret = bpf_store_hdr_opt(skops, &opt, OTEL_OPT_LEGACY_LEN, 0);
    } else {
        opt.len = OTEL_OPT_EXTENDED_LEN;
        opt.flags = ps->ctx.flags & 3;
        ret = bpf_store_hdr_opt(skops, &opt, OTEL_OPT_EXTENDED_LEN, 0);
    }
    if (ret == 0) {
        ps->sent = 1;
        count_stat(STAT_CTX_WRITTEN);
    } else {
        count_stat(STAT_CTX_NO_SPACE);
    }
}

/* PARSE_HDR_OPT_CB (a segment with an option the kernel does not know): OBI's
 * option, with the sequence number of the byte it names (a pure ACK's is the
 * next byte to come). */
static __always_inline void option_read(struct bpf_sock_ops *skops, __u64 sk)
{
    struct otel_tcp_option opt = {};
    opt.kind = OTEL_OPT_KIND;
    long ret = bpf_load_hdr_opt(skops, &opt, sizeof(opt), 0);
    if (ret < 0)
        return;
    if (!((ret == OTEL_OPT_LEGACY_LEN && opt.len == OTEL_OPT_LEGACY_LEN) ||
          (ret == OTEL_OPT_EXTENDED_LEN && opt.len == OTEL_OPT_EXTENDED_LEN)))
        return;
    void *data = (void *)(long)skops->skb_data;
    void *end = (void *)(long)skops->skb_data_end;
    if (data + 8 > end)
        return;
    __u32 seq = bpf_ntohl(*(__u32 *)(data + 4));
    struct prop_rx *known = prop_rx_opts.lookup(&sk);
    __u64 span = 0, known_span = 0;
    __builtin_memcpy(&span, opt.span_id, 8);
    if (known)
        __builtin_memcpy(&known_span, known->ctx.span_id, 8);
    if (known && known_span == span)
        return; /* a copy (a TSO segment's, a retransmit's): the first names the request */
    struct prop_rx rx = {};
    rx.seq = seq;
    __builtin_memcpy(rx.ctx.trace_id, opt.trace_id, 16);
    __builtin_memcpy(rx.ctx.span_id, opt.span_id, 8);
    rx.ctx.flags = ret == OTEL_OPT_LEGACY_LEN ? W3C_SAMPLED : opt.flags & 3;
    rx.ctx.origin = CTX_TCP_OPTION;
    prop_rx_opts.update(&sk, &rx);
    count_stat(STAT_CTX_READ);
}
#endif

int prop_sock_ops(struct bpf_sock_ops *skops)
{
    int op = skops->op;
    if (op == BPF_SOCK_OPS_TCP_CONNECT_CB) {
        /* in the connecting process: the only place a client socket is chosen */
        __u64 id = bpf_get_current_pid_tgid();
        __u32 tgid = id >> 32;
        if (!is_traced(tgid))
            return 1;
        struct bpf_sock *s = skops->sk;
        if (!s)
            return 1;
        __u64 sk = (__u64)s;
        struct prop_sock fresh = {.tgid = tgid, .armed = 1};
        prop_socks.update(&sk, &fresh);
        mark_process_uses(tgid, USES_CALLS);
        set_cb_flags(skops, BPF_SOCK_OPS_STATE_CB_FLAG |
                                ((PROPAGATION & PROP_TCP) ? BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG : 0));
        return 1;
    }
    if (op == BPF_SOCK_OPS_TCP_LISTEN_CB) {
        __u64 id = bpf_get_current_pid_tgid();
        if (!is_traced(id >> 32))
            return 1;
        struct endpoint_key key;
        endpoint_of_listener(skops, &key, 0);
        __u32 tgid = id >> 32;
        prop_listeners.update(&key, &tgid);
        return 1;
    }
#if PROPAGATION & PROP_TCP
    if (op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
        if (traced_listener(skops))
            set_cb_flags(skops, BPF_SOCK_OPS_PARSE_UNKNOWN_HDR_OPT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG);
        return 1;
    }
#endif
    struct bpf_sock *s = skops->sk;
    if (!s)
        return 1;
    __u64 sk = (__u64)s;
    if (op == BPF_SOCK_OPS_STATE_CB) {
        if (skops->args[1] == MY_TCP_CLOSE) {
            prop_socks.delete(&sk);
            prop_rx_opts.delete(&sk);
        }
        return 1;
    }
#if PROPAGATION & PROP_TCP
    if (op == BPF_SOCK_OPS_HDR_OPT_LEN_CB || op == BPF_SOCK_OPS_WRITE_HDR_OPT_CB) {
        struct prop_sock *ps = prop_socks.lookup(&sk);
        if (!ps || !ps->pending)
            return 1;
        if (op == BPF_SOCK_OPS_HDR_OPT_LEN_CB)
            option_room(skops, ps);
        else
            option_write(skops, ps);
        return 1;
    }
    if (op == BPF_SOCK_OPS_PARSE_HDR_OPT_CB) {
        option_read(skops, sk);
        return 1;
    }
#endif
    return 1;
}

#endif /* PROPAGATION */
