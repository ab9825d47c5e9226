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
 * machine needs is chosen in otelbpf/sources/gpu.py (NCCL_ID_FLAGS).
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
    __u32 flags; /* the site's */
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

BPF_HASH(call_sites, struct call_site_key, struct call_site, 16384);
BPF_HASH(call_stacks, __u32, struct call_stack, 16384);

static __always_inline void emit_call(__u64 id, struct call_frame *frame, __u64 end_ns, __s64 ret)
{
    struct call_record *rec = events.ringbuf_reserve(sizeof(struct call_record));
    if (!rec) {
        count_stat(STAT_LOST);
        return;
    }
    __builtin_memset(rec, 0, sizeof(*rec));
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
    if (site->flags & CALL_READS_STACK_ARG) /* at entry, sp points at the return address */
        bpf_probe_read_user(&frame.args[4], 2 * sizeof(__u64), (void *)(PT_REGS_SP(ctx) + 8));
    else if ((site->flags & CALL_READS_ARG2_POINTEE) && frame.args[2])
        bpf_probe_read_user(&frame.args[4], 2 * sizeof(__u64), (void *)frame.args[2]);
    if (!(site->flags & CALL_HAS_RETURN)) {
        emit_call(id, &frame, frame.ts, 0);
        return 0;
    }
    __u32 tid = (__u32)id;
    struct call_stack *stack = call_stacks.lookup(&tid);
    if (!stack) {
        struct call_stack empty = {};
        call_stacks.update(&tid, &empty);
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
