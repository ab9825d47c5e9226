/* TLS plaintext: uprobes on OpenSSL's SSL_read, SSL_write, SSL_read_ex,
 * SSL_write_ex (entry + return) and SSL_free (entry). Included by capture.c
 * after socket.c; attached once per library file (pid -1) by
 * otelbpf/sources/tls.py, so every process mapping that file is covered from
 * its first call, and the traced-process filter runs first.
 *
 * At entry the thread's call is remembered (ssl, buffer, length pointer of
 * the _ex forms); at return the bytes actually read or written (ret, or
 * *readbytes / *written) are copied, bounded by CAPTURE_BYTES (whole, in
 * pieces, on a connection marked for it: capture.h), as an EV_DATA record
 * with source SOURCE_TLS on the connection the SSL object is attributed to:
 *
 *   1. socket-bound SSL (curl, nginx, CPython ssl on a socket): socket I/O on
 *      the same thread *inside* the call (socket.c calls tls_saw_socket_io)
 *      names the connection; ssl -> connection is remembered (ssl_conns);
 *   2. an SSL object already attributed: ssl_conns;
 *   3. memory BIOs (asyncio, uvicorn --ssl-*: no fd, no socket I/O inside
 *      the call): a read is attributed to the last socket receive on the
 *      same thread before it (the event loop reads ciphertext, feeds the BIO
 *      and calls SSL_read in one callback); a write whose SSL object is not
 *      known yet is attributed by the next socket send on the thread
 *      (tls_write_waiting): that first write's record waits in
 *      tls_write_held (per thread) and is submitted at that send, with its
 *      connection; a thread that never sends drops it at its next SSL write
 *      (counted, STAT_TLS_UNATTRIBUTED).
 *
 * SSL_free forgets the object (its address may be reused for another
 * connection). Plaintext of a connection user space muted for SOURCE_TLS is
 * not copied; the ciphertext (SOURCE_SOCKET) is muted by user space as soon
 * as plaintext is seen, independently.
 */
#ifndef CAPTURE_TLS
#define CAPTURE_TLS 1
#endif
/* A receive older than this is not the ciphertext of a memory-BIO read. */
#define TLS_RECV_WINDOW_NS 1000000000ULL

struct tls_call {
    __u64 ssl;
    __u64 buf;
    __u64 len_ptr; /* size_t * of SSL_read_ex/SSL_write_ex; 0 for the int forms */
    __u64 entry_ts;
    __u64 sock_ts; /* first socket I/O of the thread inside the call, in the call's direction */
    __u64 conn_id; /* its connection (0: none inside the call) */
    __s32 fd;
    __u8 direction;
    /* a write whose plaintext starts a request: the socket write it makes
     * carries its context (bpf/propagate.c) */
    __u8 starts_request;
    __u8 pad[2];
};

struct ssl_key {
    __u32 tgid;
    __u32 pad;
    __u64 ssl;
};

struct ssl_conn {
    __u64 conn_id;
    __s32 fd;
    __u32 pad;
};

struct thread_io {
    __u64 conn_id;
    __u64 ts;
    __s32 fd;
    __u32 tid; /* tls_recv_slot: the thread whose receive it holds (0: empty) */
};

/* LRU: a thread killed inside a call leaves its entry behind. */
BPF_TABLE("lru_hash", __u32, struct tls_call, tls_calls, 16384);
BPF_TABLE("lru_hash", struct ssl_key, struct ssl_conn, ssl_conns, 65536);
/* tid -> the last stream receive outside a TLS call (memory-BIO reads). */
BPF_TABLE("lru_hash", __u32, struct thread_io, tls_last_recv, 16384);
/* The same for a process that has not called OpenSSL yet (no USES_TLS): one
 * slot per CPU, owned by the thread whose receive it holds, so most traffic
 * (plain HTTP, nginx with libssl linked but unused) pays a store, not an LRU
 * update per receive. Only that process's first memory-BIO SSL_read looks
 * here: it follows its ciphertext's receive on the same thread, on the same
 * CPU unless the thread was moved in between (then that one read goes
 * unattributed, counted in STAT_TLS_UNATTRIBUTED). */
BPF_PERCPU_ARRAY(tls_recv_slot, struct thread_io, 1);
/* connection -> time of its latest receive made inside a TLS call: a later
 * SSL_read served from OpenSSL's read-ahead (no socket I/O inside) returns
 * bytes that had arrived by then. */
BPF_TABLE("lru_hash", __u64, __u64, tls_conn_recv, 65536);
/* tid -> an SSL object whose write had no connection yet: the next send binds it. */
BPF_TABLE("lru_hash", __u32, struct ssl_key, tls_write_waiting, 16384);
BPF_PERCPU_ARRAY(tls_scratch, struct data_record, 1);
/* tid -> the record of a first memory-BIO write, until the send that carries it. Few at a time. */
BPF_TABLE("lru_hash", __u32, struct data_record, tls_write_held, 256);

/* Called by socket.c for every stream socket I/O of a traced thread, with
 * the connection's id (also when its ciphertext is muted). */
static __always_inline void tls_saw_socket_io(__u64 id, struct sock_io *io, __u64 conn_id)
{
#if CAPTURE_TLS
    if (io->protocol == MY_IPPROTO_UDP || !conn_id)
        return;
    __u32 tid = (__u32)id;
    if (!(io->uses & USES_TLS)) {
        /* No OpenSSL call yet, so none in flight (tls_enter marks the
         * process first) and no write waiting: keep the receive only. */
        if (io->direction == DIR_INGRESS) {
            int zero = 0;
            struct thread_io *slot = tls_recv_slot.lookup(&zero);
            if (slot) {
                slot->conn_id = conn_id;
                slot->ts = io->ts;
                slot->fd = io->fd;
                slot->tid = tid;
            }
        }
        return;
    }
    struct tls_call *call = tls_calls.lookup(&tid);
    if (call) {
        if (!call->conn_id) {
            call->conn_id = conn_id;
            call->fd = io->fd;
        }
        /* Only I/O in the call's own direction times it: a TLS 1.3 server's
         * first SSL_read sends its session tickets before it receives, and a
         * read stamped with that send would precede the client's write. */
        if (!call->sock_ts && io->direction == call->direction)
            call->sock_ts = io->ts;
        if (io->direction == DIR_INGRESS)
            tls_conn_recv.update(&conn_id, &io->ts);
        return;
    }
    if (io->direction == DIR_INGRESS) {
        struct thread_io last = {.conn_id = conn_id, .ts = io->ts, .fd = io->fd, .tid = tid};
        tls_last_recv.update(&tid, &last);
        return;
    }
    struct ssl_key *waiting = tls_write_waiting.lookup(&tid);
    if (waiting) {
        struct ssl_key key = *waiting;
        struct ssl_conn bound = {.conn_id = conn_id, .fd = io->fd};
        ssl_conns.update(&key, &bound);
        tls_write_waiting.delete(&tid);
        struct data_record *held = tls_write_held.lookup(&tid);
        if (held) {
            held->hdr.conn_id = conn_id;
            held->hdr.fd = io->fd;
            __u64 captured = held->hdr.captured_len;
            BOUND_FOR_VERIFIER(captured, CAPTURE_BYTES);
            submit_stat(held, sizeof(struct event_hdr) + captured);
            tls_write_held.delete(&tid);
        }
    }
#endif
}

#if CAPTURE_TLS
#if PROPAGATION
/* bpf/propagate.c */
static __always_inline int prop_tls_write_starts_request(__u64 buf, __u64 len);
static __always_inline int prop_tls_take(__u32 tid, __u8 direction, __u64 conn_id, struct trace_ctx *ctx);
#endif

static __always_inline int tls_enter(struct pt_regs *ctx, __u8 direction, int ex)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    __u32 tid = (__u32)id;
    mark_process_uses(id >> 32, USES_TLS); /* before tls_calls: socket.c looks there only then */
    struct tls_call call = {};
    call.ssl = PT_REGS_PARM1(ctx);
    call.buf = PT_REGS_PARM2(ctx);
    call.len_ptr = ex ? PT_REGS_PARM4(ctx) : 0;
    call.entry_ts = bpf_ktime_get_ns();
    call.fd = -1;
    call.direction = direction;
#if PROPAGATION
    /* only a process that calls out writes requests */
    if (direction == DIR_EGRESS && (process_uses(id >> 32) & USES_CALLS))
        call.starts_request = prop_tls_write_starts_request(call.buf, PT_REGS_PARM3(ctx));
#endif
    tls_calls.update(&tid, &call);
    return 0;
}

int tls_read_enter(struct pt_regs *ctx) { return tls_enter(ctx, DIR_INGRESS, 0); }
int tls_write_enter(struct pt_regs *ctx) { return tls_enter(ctx, DIR_EGRESS, 0); }
int tls_read_ex_enter(struct pt_regs *ctx) { return tls_enter(ctx, DIR_INGRESS, 1); }
int tls_write_ex_enter(struct pt_regs *ctx) { return tls_enter(ctx, DIR_EGRESS, 1); }

/* Bytes the call moved: ret for SSL_read/SSL_write, *len_ptr when the _ex form returned 1. */
static __always_inline __u64 tls_moved(struct tls_call *call, long ret)
{
    if (call->len_ptr) {
        if (ret != 1)
            return 0;
        __u64 moved = 0;
        bpf_probe_read_user(&moved, sizeof(moved), (void *)call->len_ptr);
        return moved;
    }
    return (int)ret > 0 ? (__u64)(int)ret : 0;
}

/* The connection of a call without socket I/O inside: the SSL object's known
 * one, else (memory BIO) the thread's last receive for a read; 0 for a write
 * (the next send will tell: tls_return holds it). Sets *ts to the best time. */
static __always_inline __u64 tls_attribute(__u32 tgid, __u32 tid, struct tls_call *call, struct ssl_key *key, __s32 *fd, __u64 *ts)
{
    struct thread_io *last = tls_last_recv.lookup(&tid);
    if (!last) {
        /* the receive before this process's first OpenSSL call (tls_recv_slot) */
        int zero = 0;
        struct thread_io *slot = tls_recv_slot.lookup(&zero);
        if (slot && slot->tid == tid)
            last = slot;
    }
    struct ssl_conn *bound = ssl_conns.lookup(key);
    if (bound) {
        *fd = bound->fd;
        if (call->direction == DIR_INGRESS) {
            /* the bytes arrived by the connection's latest receive, inside a
             * TLS call (read-ahead) or outside one (memory BIO, handshake) */
            __u64 latest = last && last->conn_id == bound->conn_id ? last->ts : 0;
            __u64 conn_id = bound->conn_id;
            __u64 *inside = tls_conn_recv.lookup(&conn_id);
            if (inside && *inside > latest)
                latest = *inside;
            if (latest && call->entry_ts - latest < TLS_RECV_WINDOW_NS)
                *ts = latest;
        }
        return bound->conn_id;
    }
    if (call->direction == DIR_INGRESS) {
        if (!last || call->entry_ts - last->ts > TLS_RECV_WINDOW_NS)
            return 0;
        struct ssl_conn fresh = {.conn_id = last->conn_id, .fd = last->fd};
        ssl_conns.update(key, &fresh);
        *fd = last->fd;
        *ts = last->ts;
        return last->conn_id;
    }
    return 0;
}

static __always_inline int tls_return(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)id;
    struct tls_call *found = tls_calls.lookup(&tid);
    if (!found)
        return 0;
    struct tls_call call = *found;
    tls_calls.delete(&tid);
    __u64 moved = tls_moved(&call, (long)PT_REGS_RC(ctx));
    if (!moved)
        return 0;
    __u32 tgid = id >> 32;
    struct ssl_key key = {.tgid = tgid, .ssl = call.ssl};
    __u64 conn_id = call.conn_id;
    __s32 fd = call.fd;
    __u64 ts = call.direction == DIR_INGRESS ? bpf_ktime_get_ns() : call.entry_ts;
    if (conn_id) {
        struct ssl_conn bound = {.conn_id = conn_id, .fd = fd};
        ssl_conns.update(&key, &bound);
        if (call.sock_ts)
            ts = call.sock_ts;
    } else {
        conn_id = tls_attribute(tgid, tid, &call, &key, &fd, &ts);
    }
    int hold = !conn_id && call.direction == DIR_EGRESS;
    if (!conn_id && !hold) {
        count_stat(STAT_TLS_UNATTRIBUTED);
        return 0;
    }
    struct conn_key ck = {.tgid = tgid, .fd = fd};
    struct conn_val *known = conns.lookup(&ck);
    __u64 end = 0; /* marked for whole capture (capture.h): the rest follows in pieces */
    if (!hold && known && known->conn_id == conn_id) {
        if (known->muted & (1 << SOURCE_TLS))
            return 0;
        if (known->whole & (1 << SOURCE_TLS))
            end = whole_end(moved, WHOLE_PIECE_BYTES);
    }
    __u64 captured = moved < CAPTURE_BYTES ? moved : CAPTURE_BYTES;
    __u64 extra = 0;
#if PROPAGATION
    /* the context its socket I/O fixed (bpf/propagate.c): after the payload (capture.h, DF_TRACE_CTX) */
    struct trace_ctx prop_ctx;
    if (!hold && prop_tls_take(tid, call.direction, conn_id, &prop_ctx))
        extra = sizeof(struct trace_ctx);
#endif
    if (!hold && ring_full_for(sizeof(struct event_hdr) + captured + extra))
        return 0; /* counted; no copy (common.h) */
    int zero = 0;
    struct data_record *rec = tls_scratch.lookup(&zero);
    if (!rec)
        return 0;
    BOUND_FOR_VERIFIER(captured, CAPTURE_BYTES);
    bpf_probe_read_user(rec->data, captured, (void *)call.buf);
    rec->hdr.ts_ns = ts;
    rec->hdr.conn_id = conn_id;
    rec->hdr.tgid = tgid;
    rec->hdr.tid = tid;
    rec->hdr.fd = fd;
    rec->hdr.type = EV_DATA;
    rec->hdr.direction = call.direction;
    rec->hdr.flags = end ? DF_PIECE : 0;
    rec->hdr.source = SOURCE_TLS;
    rec->hdr.total_len = end ? captured : moved > 0xFFFFFFFFULL ? 0xFFFFFFFF : (__u32)moved;
    rec->hdr.captured_len = captured;
    rec->hdr.task_id = thread_task_id(id);
    if (hold) {
        /* a memory-BIO write on an SSL object not attributed yet: the next
         * send of this thread carries it (tls_saw_socket_io) */
        if (tls_write_waiting.lookup(&tid))
            count_stat(STAT_TLS_UNATTRIBUTED); /* the previous one never went out */
        tls_write_waiting.update(&tid, &key);
        tls_write_held.update(&tid, rec);
        return 0;
    }
#if PROPAGATION
    if (extra) {
        __builtin_memcpy(&rec->data[captured], &prop_ctx, sizeof(prop_ctx));
        rec->hdr.flags |= DF_TRACE_CTX;
    }
#endif
    if (submit_stat(rec, sizeof(struct event_hdr) + captured + extra) == 0 && end)
        emit_whole(&rec->hdr, call.buf, moved, end, SOURCE_TLS);
    return 0;
}

int tls_read_return(struct pt_regs *ctx) { return tls_return(ctx); }
int tls_write_return(struct pt_regs *ctx) { return tls_return(ctx); }

/* SSL_free(ssl): the address may be reused by another connection's object. */
int tls_free_enter(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    struct ssl_key key = {.tgid = id >> 32, .ssl = PT_REGS_PARM1(ctx)};
    ssl_conns.delete(&key);
    return 0;
}
#endif
