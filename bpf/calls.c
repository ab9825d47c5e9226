/* Generic library call probes (uprobes): one EV_CALL per call of a probed
 * function, with up to 6 argument registers and, when its return is probed
 * too, the return value and time. Used by the TLS and GPU probes; attached
 * per process by otelbpf/sources/uprobes.py.
 *
 * Which function fired: user space registers every attached address in
 * call_sites, keyed by (tgid, runtime address); at a uprobe the instruction
 * pointer is the probed address. Returns are matched with a small
 * per-thread stack (uretprobes fire in LIFO order on a thread); calls nested
 * deeper than CALL_STACK_DEPTH are counted (STAT_CALL_DEPTH), not reported.
 *
 * Per-site flags (GPU probes, otelbpf/sources/gpu.py): CALL_OUTERMOST_ONLY
 * reports a call only when no other probed call is in progress on the thread
 * (cudaMemcpy and the cuMemcpyHtoD_v2 it makes are one operation);
 * CALL_TAKES_LAUNCHES moves the thread's kernel launch count (bpf/gpu.c) into
 * the record; CALL_READS_OUT0 reads, at return, the 8 bytes the first
 * argument points to (the pointer cudaMalloc wrote); CALL_READS_STACK_ARG
 * (x86-64) puts the first 16 bytes of the stack arguments in args[4..5] (the
 * start of the ncclUniqueId that ncclCommInitRank takes by value: on x86-64 a
 * struct over 16 bytes is copied onto the stack); CALL_READS_ARG2_POINTEE
 * (arm64) puts there the first 16 bytes the third argument points to (AAPCS64
 * passes such a struct by reference to a caller's copy, in x2). Which flag a
 * machine needs is chosen in otelbpf/sources/gpu.py (NCCL_ID_FLAGS). Either
 * flag also keeps the whole 128-byte id (call_ids, per thread) until the call
 * returns, and its record carries it as payload (captured_len = 128): user
 * space hashes it into the communicator id NCCL itself uses (commHash), the
 * same on every rank and node.
 *
 * Collective sequence numbers (NCCL sites, CALL_COMM_SEQ): each collective
 * call takes the next number of its (process, communicator handle, function)
 * at entry, counted here in comm_seqs and carried in call_info.comm_seq (the
 * number + 1; 0: not counted), so that a record lost on the way to user
 * space never shifts the numbers of the calls after it. The site's flags say
 * where the handle is (CALL_COMM_ARG: which argument) and which counter it
 * takes (CALL_COMM_FUNC: NCCL's function index). A communicator's set-up
 * (CALL_COMM_RESET with CALL_READS_OUT0: the handle it wrote, at return) and
 * its destruction (CALL_COMM_RESET: the handle in args[0], at entry) start its
 * counts again, so a handle address reused by a later communicator counts
 * from 0, as NCCL does. Handles whose set-up came before the probes count
 * from the first call seen: user space knows which (it saw no set-up).
 *
 * Rank clocks (bpf/ranks.c, compiled in with RANK_CLOCKS): a collective's site
 * (CALL_RANK_CLOCK) clocks its thread from then on; every GPU site
 * (CALL_CLOCKED) of a clocked thread reads the thread's off-CPU total at entry
 * and at return into call_info.off_cpu_entry_ns/off_cpu_return_ns, flagged
 * CALL_INFO_CLOCKED in call_info.call_flags.
 *
 * CALL_STACK (GPU profiles, compiled in with PROFILES and GPU_PROFILES): an
 * outermost call (none of the thread's probed calls in progress) takes a
 * stack sample at entry (bpf/profile.c gpu_stack_sample: EV_PROFILE of kind
 * PROFILE_GPU_CALL in profile_events, ts_ns = this call's entry stamp), which
 * user space joins to the call's EV_CALL by (tid, entry time)
 * (otelbpf/profiles/gpu.py).
 */
#ifndef CALL_STACK_DEPTH
#define CALL_STACK_DEPTH 4
#endif
#define CALL_HAS_RETURN 1
#define CALL_OUTERMOST_ONLY 2
#define CALL_TAKES_LAUNCHES 4
#define CALL_READS_OUT0 8
#define CALL_READS_STACK_ARG 16
#define CALL_READS_ARG2_POINTEE 32
#define CALL_STACK 64
#define CALL_RANK_CLOCK 128
#define CALL_CLOCKED 256
#define CALL_COMM_SEQ 512
#define CALL_COMM_RESET 1024
/* CALL_COMM_SEQ: the argument holding the handle, and the function's counter */
#define CALL_COMM_ARG(flags) (((flags) >> 16) & 7)
#define CALL_COMM_FUNC(flags) (((flags) >> 20) & 7)
#define COMM_FUNCS 8
/* frame-only: the off-CPU total was read at entry */
#define FRAME_CLOCKED (1u << 31)
#define CALL_READS_ID (CALL_READS_STACK_ARG | CALL_READS_ARG2_POINTEE)
#define NCCL_UNIQUE_ID_BYTES 128

struct call_site_key {
    __u32 tgid;
    __u32 pad;
    __u64 addr;
};

struct call_site {
    __u32 probe_id;
    __u32 flags; /* CALL_HAS_RETURN */
};

struct call_frame {
    __u64 ts;
    __u64 args[6];
    __u32 probe_id;
    __u32 flags; /* the site's, and FRAME_CLOCKED */
    __u64 off_cpu_ns; /* FRAME_CLOCKED: the thread's off-CPU total at entry */
    __u64 comm_seq;   /* CALL_COMM_SEQ: the call's number on its handle + 1 */
};

struct call_stack {
    __u32 depth;
    __u32 pad;
    struct call_frame frames[CALL_STACK_DEPTH];
};

struct call_record {
    struct event_hdr hdr;
    struct call_info info;
};

struct nccl_unique_id {
    __u8 bytes[NCCL_UNIQUE_ID_BYTES];
};

/* A call that read an ncclUniqueId: its record with the id as payload. */
struct call_id_record {
    struct event_hdr hdr;
    struct call_info info;
    struct nccl_unique_id id;
};

BPF_HASH(call_sites, struct call_site_key, struct call_site, 16384);
BPF_HASH(call_stacks, __u32, struct call_stack, 16384);
/* All zeros, never written: a thread's first call_stack is copied from here, not
 * from the BPF stack (328 bytes of its 512, which call_enter needs for the call). */
BPF_ARRAY(call_stack_zero, struct call_stack, 1);
/* tid -> the ncclUniqueId its communicator set-up in progress received */
BPF_HASH(call_ids, __u32, struct nccl_unique_id, 1024);

struct nccl_comm_key {
    __u32 tgid;
    __u32 pad;
    __u64 handle; /* the ncclComm_t */
};

struct comm_counts {
    __u64 calls[COMM_FUNCS]; /* collectives made on the handle, per NCCL function index */
};

/* Not an LRU: an evicted handle would count from 0 again. Full: calls go uncounted (comm_seq 0);
 * entries of exited processes are deleted by user space (otelbpf/sources/gpu.py). */
BPF_HASH(comm_seqs, struct nccl_comm_key, struct comm_counts, 8192);

static __always_inline void comm_forget(__u32 tgid, __u64 handle)
{
    struct nccl_comm_key key = {.tgid = tgid, .handle = handle};
    comm_seqs.delete(&key);
}

/* The call's number on its handle (+ 1), counting it; 0 when it cannot be counted. */
static __always_inline __u64 comm_take_seq(__u32 tgid, struct call_frame *frame)
{
    __u32 function = CALL_COMM_FUNC(frame->flags);
    __u64 handle;
    switch (CALL_COMM_ARG(frame->flags)) {
    case 4: handle = frame->args[4]; break;
    case 5: handle = frame->args[5]; break;
    default: return 0; /* collectives keep their communicator in the 5th or 6th argument */
    }
    if (function >= COMM_FUNCS || !handle)
        return 0;
    struct nccl_comm_key key = {.tgid = tgid, .handle = handle};
    struct comm_counts *counts = comm_seqs.lookup(&key);
    if (!counts) {
        struct comm_counts fresh = {};
        comm_seqs.insert(&key, &fresh);
        counts = comm_seqs.lookup(&key);
        if (!counts)
            return 0;
    }
    return __sync_fetch_and_add(&counts->calls[function], 1) + 1;
}

/* The record of a call, with room for an ncclUniqueId when the call read one. */
static __always_inline struct call_record *reserve_call(__u64 id, struct call_frame *frame)
{
    if (frame->flags & CALL_READS_ID) {
        __u32 tid = (__u32)id;
        struct nccl_unique_id *unique = call_ids.lookup(&tid);
        if (unique) {
            struct call_id_record *rec = events.ringbuf_reserve(sizeof(struct call_id_record));
            if (!rec)
                return 0;
            __builtin_memset(rec, 0, sizeof(struct call_record));
            __builtin_memcpy(&rec->id, unique, sizeof(rec->id));
            rec->hdr.captured_len = sizeof(rec->id);
            call_ids.delete(&tid);
            return (struct call_record *)rec;
        }
    }
    struct call_record *rec = events.ringbuf_reserve(sizeof(struct call_record));
    if (rec)
        __builtin_memset(rec, 0, sizeof(*rec));
    return rec;
}

static __always_inline void emit_call(__u64 id, struct call_frame *frame, __u64 end_ns, __s64 ret)
{
    struct call_record *rec = reserve_call(id, frame);
    if (!rec) {
        count_stat(STAT_LOST);
        return;
    }
    rec->hdr.ts_ns = frame->ts;
    rec->hdr.tgid = id >> 32;
    rec->hdr.tid = (__u32)id;
    rec->hdr.fd = -1;
    rec->hdr.type = EV_CALL;
    rec->hdr.task_id = thread_task_id(id);
    rec->info.probe_id = frame->probe_id;
    rec->info.end_ns = end_ns;
    __builtin_memcpy(rec->info.args, frame->args, sizeof(frame->args));
    rec->info.ret = ret;
    if (frame->flags & CALL_TAKES_LAUNCHES)
        gpu_take_launches((__u32)id, rec->hdr.task_id, &rec->info);
    if ((frame->flags & CALL_READS_OUT0) && frame->args[0]) {
        __u64 out = 0;
        if (bpf_probe_read_user(&out, sizeof(out), (void *)frame->args[0]) == 0)
            rec->info.out0 = out;
        if ((frame->flags & CALL_COMM_RESET) && out) /* a communicator set up at this handle */
            comm_forget(id >> 32, out);
    }
    rec->info.comm_seq = frame->comm_seq;
    __u64 off_cpu_ns = 0;
    if ((frame->flags & FRAME_CLOCKED) && rank_clock_read((__u32)id, &off_cpu_ns)) {
        rec->info.call_flags |= CALL_INFO_CLOCKED;
        rec->info.off_cpu_entry_ns = frame->off_cpu_ns;
        rec->info.off_cpu_return_ns = off_cpu_ns;
    }
    events.ringbuf_submit(rec, ring_wakeup_flags());
}

int call_enter(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    struct call_site_key key = {.tgid = id >> 32, .addr = PT_REGS_IP(ctx)};
    struct call_site *site = call_sites.lookup(&key);
    if (!site)
        return 0;
    struct call_frame frame = {};
    frame.ts = bpf_ktime_get_ns();
    frame.probe_id = site->probe_id;
    frame.flags = site->flags;
    frame.args[0] = PT_REGS_PARM1(ctx);
    frame.args[1] = PT_REGS_PARM2(ctx);
    frame.args[2] = PT_REGS_PARM3(ctx);
    frame.args[3] = PT_REGS_PARM4(ctx);
    frame.args[4] = PT_REGS_PARM5(ctx);
    frame.args[5] = PT_REGS_PARM6(ctx);
    void *unique_id = 0;
    if (site->flags & CALL_READS_STACK_ARG) /* at entry, sp points at the return address */
        unique_id = (void *)(PT_REGS_SP(ctx) + 8);
    else if ((site->flags & CALL_READS_ARG2_POINTEE) && frame.args[2])
        unique_id = (void *)frame.args[2];
    if (unique_id) {
        struct nccl_unique_id whole = {};
        if (bpf_probe_read_user(&whole, sizeof(whole), unique_id) == 0) {
            __builtin_memcpy(&frame.args[4], whole.bytes, 2 * sizeof(__u64));
            __u32 tid = (__u32)id;
            call_ids.update(&tid, &whole);
        } else { /* the whole id is out of reach: at least its start, as before */
            bpf_probe_read_user(&frame.args[4], 2 * sizeof(__u64), unique_id);
        }
    }
    if (site->flags & CALL_COMM_SEQ)
        frame.comm_seq = comm_take_seq(id >> 32, &frame);
    else if ((site->flags & CALL_COMM_RESET) && !(site->flags & CALL_READS_OUT0) && frame.args[0])
        comm_forget(id >> 32, frame.args[0]); /* ncclCommDestroy */
    if (site->flags & CALL_RANK_CLOCK)
        rank_clock_join((__u32)id);
    if ((site->flags & CALL_CLOCKED) && rank_clock_read((__u32)id, &frame.off_cpu_ns))
        frame.flags |= FRAME_CLOCKED;
    if (!(site->flags & CALL_HAS_RETURN)) {
        emit_call(id, &frame, frame.ts, 0);
        return 0;
    }
    __u32 tid = (__u32)id;
    struct call_stack *stack = call_stacks.lookup(&tid);
    if (!stack) {
        int zero_index = 0;
        struct call_stack *empty = call_stack_zero.lookup(&zero_index);
        if (!empty)
            return 0;
        call_stacks.update(&tid, empty);
        stack = call_stacks.lookup(&tid);
        if (!stack)
            return 0;
    }
    __u32 depth = stack->depth;
    if (GPU_STACKS && depth == 0 && (site->flags & CALL_STACK))
        gpu_stack_sample(ctx, id, frame.ts, PROFILE_GPU_CALL, 1, 0);
    if (depth < CALL_STACK_DEPTH)
        stack->frames[depth] = frame;
    else
        count_stat(STAT_CALL_DEPTH);
    stack->depth = depth + 1;
    return 0;
}

int call_return(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)id;
    struct call_stack *stack = call_stacks.lookup(&tid);
    if (!stack || stack->depth == 0)
        return 0;
    __u32 depth = stack->depth - 1;
    stack->depth = depth;
    if (depth < CALL_STACK_DEPTH) {
        struct call_frame frame = stack->frames[depth];
        /* depth > 0: made inside another probed call of this thread (the driver call a runtime call makes) */
        if (!(depth > 0 && (frame.flags & CALL_OUTERMOST_ONLY)))
            emit_call(id, &frame, bpf_ktime_get_ns(), (__s64)PT_REGS_RC(ctx));
    }
    if (depth == 0)
        call_stacks.delete(&tid);
    return 0;
}
