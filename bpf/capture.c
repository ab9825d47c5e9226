/* otelbpf kernel side: socket payload capture from syscall tracepoints.
 *
 * Design rules (DESIGN.md):
 *  - Tracepoints only (no kprobes/fentry on this class of kernels): the
 *    raw_syscalls sys_enter/sys_exit pair for the syscalls, sock:* and
 *    sched:* for sockets and processes. Only tracepoint arguments, user
 *    memory and the saved user registers (pt_regs) are read: the kernel
 *    headers BCC compiles against may not match the running kernel, so no
 *    kernel struct is ever dereferenced by header layout.
 *  - Filter first: every handler returns at once for untraced processes.
 *  - Which fd is a socket is learnt from sock:sock_{recv,send}_length, which
 *    fire inside the syscall with the struct sock pointer, family and
 *    protocol. The connection tuple comes from sock:inet_sock_set_state
 *    (keyed by that same sock pointer), so short-lived connections carry
 *    their addresses even if they are gone before user space looks.
 *  - Records are submitted without waking the consumer (BPF_RB_NO_WAKEUP);
 *    user space drains on a timer. Wake-ups, not decoding, are the big cost.
 *
 * Compile-time parameters (-D): CAPTURE_BYTES (power of two),
 * RINGBUF_PAGES, MAX_IOV, CAPTURE_UNIX.
 */
#include <uapi/linux/ptrace.h>
#include <asm/unistd.h>

#include "capture.h"

#ifndef CAPTURE_BYTES
#define CAPTURE_BYTES 4096
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 4096
#endif
#ifndef MAX_IOV
#define MAX_IOV 8
#endif
#ifndef PID_MAX
#define PID_MAX 4194304
#endif
#ifndef CAPTURE_UNIX
#define CAPTURE_UNIX 1
#endif
#ifndef HAVE_SK_DATA_READY
#define HAVE_SK_DATA_READY 1
#endif

/* Hide a value's known range from the compiler so the bounds check that
 * follows stays in the program for the verifier to see. */
#define BOUND_FOR_VERIFIER(var, max)            \
    do {                                        \
        asm volatile("" : "+r"(var));           \
        if ((var) > (max))                      \
            (var) = (max);                      \
    } while (0)

#define MODE_LISTED 0 /* trace tgids in traced_tgids */
#define MODE_ALL 1    /* trace every tgid but the agent's */

#define TRACED_BY_PID 1  /* listed by --pid (or a descendant) */
#define TRACED_BY_COMM 2 /* matched --comm; re-checked at exec */

#define MY_AF_UNIX 1
#define MY_AF_INET 2
#define MY_AF_INET6 10
#define MY_IPPROTO_TCP 6
#define MY_MSG_PEEK 2
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_CLOSE 7

enum io_kind {
    IO_BUF = 1,     /* read/write/recvfrom/sendto: one flat buffer */
    IO_IOV = 2,     /* readv/writev: iovec array */
    IO_MSG = 3,     /* recvmsg/sendmsg: user msghdr */
    IO_SENDFILE = 4,
    IO_ACCEPT = 5,  /* accept/accept4: the new fd comes back at exit */
};

struct config {
    __u32 mode;
    __u32 agent_tgid;
};

/* What a syscall's enter handler leaves for its exit handler. */
struct active_io {
    __u64 enter_ts;
    __u64 buf; /* flat buffer, iovec array or msghdr (user pointers) */
    __u64 sk;  /* set by sock_*_length: proves the fd is a socket */
    __u64 peer_sk; /* Unix sockets: the receiving end, from sk_data_ready */
    __s32 fd;
    __u32 iovcnt;
    __u16 family;
    __u8 protocol;
    __u8 kind;
    __u8 direction;
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
    __u8 muted; /* set by user space: no protocol we know, stop copying */
};

struct tuple {
    __u16 family;
    __u16 local_port;
    __u16 peer_port;
    __u8 pad[2];
    __u8 local_addr[16];
    __u8 peer_addr[16];
};

struct comm_key {
    char comm[16];
};

struct data_record {
    struct event_hdr hdr;
    /* Twice the capture size so the verifier accepts offset + length
     * bounds when several iovecs are gathered. */
    __u8 data[CAPTURE_BYTES * 2];
};

struct conn_record {
    struct event_hdr hdr;
    struct conn_info info;
};

BPF_ARRAY(config_map, struct config, 1);
/* Indexed by tgid (0 = not traced, else TRACED_BY_*): an array, so the
 * filter that runs on every syscall of the host is a bounds check and a
 * load, not a hash lookup. Sized to the host's pid_max. */
BPF_ARRAY(traced_tgids, __u8, PID_MAX);
BPF_HASH(traced_comms, struct comm_key, __u8, 256);
BPF_HASH(active, __u64, struct active_io, 16384);
BPF_TABLE("lru_hash", struct conn_key, struct conn_val, conns, 65536);
BPF_TABLE("lru_hash", __u64, struct tuple, sk_tuples, 65536);
BPF_ARRAY(conn_seq, __u64, 1);
BPF_PERCPU_ARRAY(scratch, struct data_record, 1);
BPF_PERCPU_ARRAY(stats, __u64, STAT_COUNT);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
/* asyncio task tracking (uprobes on PyIter_Send in traced Pythons). */
BPF_HASH(py_depth, __u32, __u32, 16384);
BPF_HASH(py_current, __u32, __u64, 16384);

static __always_inline void count_stat(int index)
{
    __u64 *value = stats.lookup(&index);
    if (value)
        *value += 1;
}

static __always_inline int is_traced(__u32 tgid)
{
    int zero = 0;
    struct config *cfg = config_map.lookup(&zero);
    if (!cfg)
        return 0;
    if (cfg->mode == MODE_ALL)
        return tgid != cfg->agent_tgid;
    __u8 *reason = traced_tgids.lookup(&tgid);
    return reason && *reason;
}

static __always_inline void set_traced(__u32 tgid, __u8 reason)
{
    __u8 *slot = traced_tgids.lookup(&tgid);
    if (slot)
        *slot = reason;
}

static __always_inline __u8 traced_reason(__u32 tgid)
{
    __u8 *slot = traced_tgids.lookup(&tgid);
    return slot ? *slot : 0;
}

/* ---- process lifecycle: keep traced_tgids right for new processes ---- */

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    /* Runs in the parent. A child inherits the parent's reason to be
     * traced. child_pid may be a thread of the same process: that entry is
     * harmless and goes away when the thread exits (sched_process_exit). */
    __u32 parent_tgid = bpf_get_current_pid_tgid() >> 32;
    __u8 reason = traced_reason(parent_tgid);
    if (reason)
        set_traced(args->child_pid, reason);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    /* The comm is the new program's by now: (un)trace by --comm. */
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct comm_key key = {};
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    __u8 reason = traced_reason(tgid);
    if (traced_comms.lookup(&key)) {
        if (!reason)
            set_traced(tgid, TRACED_BY_COMM);
    } else if (reason == TRACED_BY_COMM) {
        set_traced(tgid, 0);
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    __u32 tid = (__u32)id;
    if (!is_traced(tgid))
        return 0;
    set_traced(tid, 0);
    if (!args->group_dead)
        return 0;
    struct event_hdr *rec = events.ringbuf_reserve(sizeof(struct event_hdr));
    if (!rec) {
        count_stat(STAT_LOST);
        return 0;
    }
    __builtin_memset(rec, 0, sizeof(*rec));
    rec->ts_ns = bpf_ktime_get_ns();
    rec->tgid = tgid;
    rec->tid = tid;
    rec->fd = -1;
    rec->type = EV_PROC_EXIT;
    events.ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
    return 0;
}

/* ---- connection tuples, from the TCP state machine ---- */

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != MY_IPPROTO_TCP)
        return 0;
    __u64 sk = (__u64)args->skaddr;
    if (args->newstate == TCP_CLOSE) {
        sk_tuples.delete(&sk);
        return 0;
    }
    /* ESTABLISHED carries the whole tuple on both sides (SYN_SENT has no
     * source port yet). Local is "source" for both: for an accepted
     * socket the kernel's sport is the listening port. */
    if (args->newstate != TCP_ESTABLISHED)
        return 0;
    struct tuple t = {};
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

/* ---- role hints: accept()ed or connect()ed ---- */

static __always_inline void remember_role(__u32 tgid, int fd, __u8 role)
{
    struct conn_key key = {.tgid = tgid, .fd = fd};
    struct conn_val val = {.role = role};
    conns.update(&key, &val);
}

/* ---- data syscalls ---- */

/* Called for a traced process's syscall of interest: what its exit needs. */
static __always_inline int on_io_enter(__u64 id, int fd, __u64 buf, __u32 iovcnt, __u8 kind, __u8 direction)
{
    struct active_io io = {};
    io.enter_ts = bpf_ktime_get_ns();
    io.buf = buf;
    io.fd = fd;
    io.iovcnt = iovcnt;
    io.kind = kind;
    io.direction = direction;
    if (active.update(&id, &io) != 0)
        count_stat(STAT_IO_MAP_FULL);
    return 0;
}

/* Inside the syscall: the fd is a socket; remember which. */
static __always_inline int on_sock_io(__u64 sk, __u16 family, __u16 protocol)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct active_io *io = active.lookup(&id);
    if (!io)
        return 0;
    io->sk = sk;
    io->family = family;
    io->protocol = (__u8)protocol;
    return 0;
}

TRACEPOINT_PROBE(sock, sock_recv_length)
{
    return on_sock_io((__u64)args->sk, args->family, args->protocol);
}

TRACEPOINT_PROBE(sock, sock_send_length)
{
    return on_sock_io((__u64)args->sk, args->family, args->protocol);
}

#if HAVE_SK_DATA_READY && CAPTURE_UNIX
/* A Unix-socket write wakes the receiving socket inside the writer's
 * syscall: that names the other end of the connection, which user space
 * uses to pair a client with its server. A raw tracepoint (it fires for
 * every segment any socket on the host receives, so it must be cheap):
 * only the sock pointer is used, and only when the current thread is in a
 * traced write; the exit keeps it only for Unix sockets. */
RAW_TRACEPOINT_PROBE(sk_data_ready)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct active_io *io = active.lookup(&id);
    if (!io || io->direction != DIR_EGRESS)
        return 0;
    __u64 sk = (__u64)ctx->args[0];
    if (sk != io->sk)
        io->peer_sk = sk;
    return 0;
}
#endif

static __always_inline int wanted_socket(struct active_io *io)
{
    if (io->family == MY_AF_INET || io->family == MY_AF_INET6)
        return io->protocol == MY_IPPROTO_TCP;
    if (io->family == MY_AF_UNIX)
        return CAPTURE_UNIX;
    return 0;
}

static __always_inline void emit_close(__u32 tgid, __u32 tid, int fd, __u64 conn_id)
{
    struct event_hdr *rec = events.ringbuf_reserve(sizeof(struct event_hdr));
    if (!rec) {
        count_stat(STAT_LOST);
        return;
    }
    __builtin_memset(rec, 0, sizeof(*rec));
    rec->ts_ns = bpf_ktime_get_ns();
    rec->conn_id = conn_id;
    rec->tgid = tgid;
    rec->tid = tid;
    rec->fd = fd;
    rec->type = EV_CONN_CLOSE;
    events.ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
}

static __always_inline void emit_conn_info(__u64 id, struct active_io *io, __u64 conn_id, __u8 role, __u8 type)
{
    struct conn_record *rec = events.ringbuf_reserve(sizeof(struct conn_record));
    if (!rec) {
        count_stat(STAT_LOST);
        return;
    }
    __builtin_memset(rec, 0, sizeof(*rec));
    rec->hdr.ts_ns = io->enter_ts;
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
        rec->info.family = t->family;
        rec->info.local_port = t->local_port;
        rec->info.peer_port = t->peer_port;
        __builtin_memcpy(rec->info.local_addr, t->local_addr, 16);
        __builtin_memcpy(rec->info.peer_addr, t->peer_addr, 16);
    } else {
        /* Opened before the agent started (or not TCP): user space
         * resolves the tuple from /proc while the socket still lives. */
        rec->info.family = io->family == MY_AF_UNIX ? MY_AF_UNIX : 0;
        count_stat(STAT_NO_TUPLE);
    }
    bpf_get_current_comm(&rec->info.comm, sizeof(rec->info.comm));
    events.ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
}

/* The connection id for (tgid, fd), announcing the connection the first
 * time it carries data; 0 when user space muted it (nothing to copy). */
static __always_inline __u64 connection_for(__u64 id, struct active_io *io)
{
    struct conn_key key = {.tgid = id >> 32, .fd = io->fd};
    struct conn_val *known = conns.lookup(&key);
    __u8 role = ROLE_UNKNOWN;
    if (known) {
        if (known->conn_id && known->sk == io->sk) {
            if (io->peer_sk && !known->peer_sk) {
                known->peer_sk = io->peer_sk;
                emit_conn_info(id, io, known->conn_id, known->role, EV_CONN_PEER);
            }
            return known->muted ? 0 : known->conn_id;
        }
        if (known->conn_id) /* fd reused without a close we saw (dup2) */
            emit_close(key.tgid, (__u32)id, io->fd, known->conn_id);
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
    conns.update(&key, &fresh);
    emit_conn_info(id, io, fresh.conn_id, role, EV_CONN_OPEN);
    return fresh.conn_id;
}

/* Copy up to CAPTURE_BYTES of the iovec array into rec->data. */
static __always_inline __u64 gather_iov(struct data_record *rec, __u64 iov_ptr, __u32 iovcnt, __u32 total, __u16 *flags)
{
    __u64 captured = 0;
    __u64 consumed = 0;
    /* A bounded loop (kernel >= 5.3 verifies it without unrolling). */
    for (int i = 0; i < MAX_IOV; i++) {
        if (i >= iovcnt || consumed >= total || captured >= CAPTURE_BYTES)
            break;
        struct iovec_user {
            __u64 base;
            __u64 len;
        } iov = {};
        if (bpf_probe_read_user(&iov, sizeof(iov), (void *)(iov_ptr + i * sizeof(iov))) != 0)
            break;
        __u64 part = iov.len < (total - consumed) ? iov.len : (total - consumed);
        __u64 room = CAPTURE_BYTES - captured;
        __u64 take = part < room ? part : room;
        __u64 offset = captured;
        BOUND_FOR_VERIFIER(offset, CAPTURE_BYTES - 1);
        BOUND_FOR_VERIFIER(take, CAPTURE_BYTES);
        bpf_probe_read_user(&rec->data[offset], take, (void *)iov.base);
        captured += take;
        consumed += part;
    }
    if (consumed < total && captured < CAPTURE_BYTES)
        *flags |= DF_IOV_TRUNCATED;
    return captured;
}

static __always_inline int on_io_exit(__u64 id, long ret)
{
    struct active_io *found = active.lookup(&id);
    if (!found)
        return 0;
    struct active_io io = *found;
    active.delete(&id);
    if (io.kind == IO_ACCEPT) {
        if (ret >= 0)
            remember_role(id >> 32, (int)ret, ROLE_ACCEPTED);
        return 0;
    }
    __u8 direction = io.direction;
    if (ret <= 0 || io.sk == 0 || !wanted_socket(&io))
        return 0;
    if (io.family != MY_AF_UNIX)
        io.peer_sk = 0; /* a TCP receiver woken on loopback is not a pairing */

    __u64 conn_id = connection_for(id, &io);
    if (!conn_id)
        return 0;

    int zero = 0;
    struct data_record *rec = scratch.lookup(&zero);
    if (!rec)
        return 0;
    __u32 total = ret > 0x7fffffff ? 0x7fffffff : (__u32)ret;
    __u16 flags = 0;
    __u64 captured = 0;
    if (io.kind == IO_BUF) {
        captured = total < CAPTURE_BYTES ? total : CAPTURE_BYTES;
        BOUND_FOR_VERIFIER(captured, CAPTURE_BYTES);
        bpf_probe_read_user(rec->data, captured, (void *)io.buf);
    } else if (io.kind == IO_IOV) {
        captured = gather_iov(rec, io.buf, io.iovcnt, total, &flags);
    } else if (io.kind == IO_MSG) {
        struct msghdr_user {
            __u64 name;
            __u32 namelen;
            __u32 pad;
            __u64 iov;
            __u64 iovlen;
        } msg = {};
        if (bpf_probe_read_user(&msg, sizeof(msg), (void *)io.buf) == 0)
            captured = gather_iov(rec, msg.iov, (__u32)msg.iovlen, total, &flags);
    } else {
        flags |= DF_SENDFILE;
    }

    rec->hdr.ts_ns = direction == DIR_INGRESS ? bpf_ktime_get_ns() : io.enter_ts;
    rec->hdr.conn_id = conn_id;
    rec->hdr.tgid = id >> 32;
    rec->hdr.tid = (__u32)id;
    rec->hdr.fd = io.fd;
    rec->hdr.type = EV_DATA;
    rec->hdr.direction = direction;
    rec->hdr.flags = flags;
    rec->hdr.total_len = total;
    rec->hdr.captured_len = captured;
    __u32 tid = (__u32)id;
    __u64 *task = py_current.lookup(&tid);
    rec->hdr.task_id = task ? *task : 0;
    BOUND_FOR_VERIFIER(captured, CAPTURE_BYTES);
    __u32 size = sizeof(struct event_hdr) + captured;
    if (events.ringbuf_output(rec, size, BPF_RB_NO_WAKEUP) != 0)
        count_stat(STAT_LOST);
    return 0;
}

/* ---- the syscalls: two raw tracepoints for all of them ----
 *
 * raw_syscalls sys_enter/sys_exit run for every syscall on the host, but skip
 * the per-event work of the syscalls:* tracepoints (perf buffer, argument
 * copies), which bench/probe_tax.py measured as the larger tax on a busy
 * server. Each program first rejects syscalls it does not handle (a switch on
 * the number, no memory access) and untraced processes. Arguments come from
 * the saved user registers (struct pt_regs: the syscall ABI, stable across
 * kernel versions), 32-bit compat syscalls (other numbers) are ignored.
 */

static __always_inline __u64 syscall_arg(struct pt_regs *regs, int n)
{
    __u64 value = 0;
    switch (n) {
    case 1: bpf_probe_read_kernel(&value, sizeof(value), &PT_REGS_PARM1_SYSCALL(regs)); break;
    case 2: bpf_probe_read_kernel(&value, sizeof(value), &PT_REGS_PARM2_SYSCALL(regs)); break;
    case 3: bpf_probe_read_kernel(&value, sizeof(value), &PT_REGS_PARM3_SYSCALL(regs)); break;
    case 4: bpf_probe_read_kernel(&value, sizeof(value), &PT_REGS_PARM4_SYSCALL(regs)); break;
    }
    return value;
}

static __always_inline int is_native_syscall(struct pt_regs *regs)
{
#if defined(bpf_target_x86)
    __u64 cs = 0;
    bpf_probe_read_kernel(&cs, sizeof(cs), &regs->cs);
    return cs == 0x33; /* __USER_CS; ia32 compat calls come in on 0x23 */
#elif defined(bpf_target_arm64)
    __u64 pstate = 0;
    bpf_probe_read_kernel(&pstate, sizeof(pstate), &regs->pstate);
    return !(pstate & 0x10); /* PSR_MODE32_BIT */
#else
    return 1;
#endif
}

static __always_inline int on_close(__u64 id, int fd)
{
    __u32 tgid = id >> 32;
    struct conn_key key = {.tgid = tgid, .fd = fd};
    struct conn_val *known = conns.lookup(&key);
    if (!known)
        return 0;
    if (known->conn_id)
        emit_close(tgid, (__u32)id, fd, known->conn_id);
    conns.delete(&key);
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_enter)
{
    long nr = (long)ctx->args[1];
    switch (nr) {
    case __NR_read: case __NR_write: case __NR_readv: case __NR_writev:
    case __NR_recvfrom: case __NR_sendto: case __NR_recvmsg: case __NR_sendmsg:
    case __NR_sendfile: case __NR_close: case __NR_connect: case __NR_accept: case __NR_accept4:
        break;
    default:
        return 0;
    }
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
    if (!is_native_syscall(regs))
        return 0;
    int fd = (int)syscall_arg(regs, 1);
    switch (nr) {
    case __NR_read:
        return on_io_enter(id, fd, syscall_arg(regs, 2), 0, IO_BUF, DIR_INGRESS);
    case __NR_write:
        return on_io_enter(id, fd, syscall_arg(regs, 2), 0, IO_BUF, DIR_EGRESS);
    case __NR_readv:
        return on_io_enter(id, fd, syscall_arg(regs, 2), (__u32)syscall_arg(regs, 3), IO_IOV, DIR_INGRESS);
    case __NR_writev:
        return on_io_enter(id, fd, syscall_arg(regs, 2), (__u32)syscall_arg(regs, 3), IO_IOV, DIR_EGRESS);
    case __NR_recvfrom:
        if (syscall_arg(regs, 4) & MY_MSG_PEEK) /* the bytes will be read again */
            return 0;
        return on_io_enter(id, fd, syscall_arg(regs, 2), 0, IO_BUF, DIR_INGRESS);
    case __NR_sendto:
        return on_io_enter(id, fd, syscall_arg(regs, 2), 0, IO_BUF, DIR_EGRESS);
    case __NR_recvmsg:
        if (syscall_arg(regs, 3) & MY_MSG_PEEK)
            return 0;
        return on_io_enter(id, fd, syscall_arg(regs, 2), 0, IO_MSG, DIR_INGRESS);
    case __NR_sendmsg:
        return on_io_enter(id, fd, syscall_arg(regs, 2), 0, IO_MSG, DIR_EGRESS);
    case __NR_sendfile:
        return on_io_enter(id, fd, 0, 0, IO_SENDFILE, DIR_EGRESS);
    case __NR_accept:
    case __NR_accept4:
        return on_io_enter(id, fd, 0, 0, IO_ACCEPT, DIR_INGRESS);
    case __NR_connect:
        remember_role(id >> 32, fd, ROLE_CONNECTED);
        return 0;
    case __NR_close:
        return on_close(id, fd);
    }
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    /* Only syscalls whose enter left state here matter (the enter side did
     * the number and compat checks). */
    return on_io_exit(id, (long)ctx->args[1]);
}

/* ---- asyncio tasks: which coroutine a task step is running ----
 *
 * CPython's _asyncio runs every task step through the exported C function
 * PyIter_Send(coro, ...) (Python >= 3.10). Nested awaits call it again from
 * the interpreter, so only the outermost call on a thread is a task step:
 * its coroutine is the task's, and any syscall until it returns is made on
 * that task's behalf. Attached per traced Python process, by pid, so other
 * processes never hit the breakpoint. The coroutine pointer is read from
 * the first argument register: a user-space value, no struct layout.
 */
int py_send_enter(struct pt_regs *ctx)
{
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    __u32 zero = 0;
    __u32 *depth = py_depth.lookup_or_try_init(&tid, &zero);
    if (!depth)
        return 0;
    if (*depth == 0) {
        __u64 coro = PT_REGS_PARM1(ctx);
        py_current.update(&tid, &coro);
    }
    *depth += 1;
    return 0;
}

int py_send_return(struct pt_regs *ctx)
{
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    __u32 *depth = py_depth.lookup(&tid);
    if (!depth)
        return 0;
    if (*depth > 0)
        *depth -= 1;
    if (*depth == 0) {
        py_current.delete(&tid);
        py_depth.delete(&tid);
    }
    return 0;
}
