/* Stack samples of traced processes, for CPU and off-CPU profiles.
 *
 * On-CPU: profile_on_cpu runs on the software CPU-clock perf event at
 * --profile-hz (otelbpf/profiles/sampler.py attaches it on every CPU; there
 * is no hardware PMU on most VMs). Off-CPU (--off-cpu): sched:sched_switch,
 * when a traced thread blocks, samples it the same way while it is still
 * `current`, and when it runs again emits EV_OFFCPU_END with the time it
 * spent blocked; user space joins the two and keeps blocks longer than the
 * minimum.
 *
 * A sample carries what user space cannot recover later:
 *   - the user registers (from the sample when it hit user mode, else the
 *     syscall's saved frame from bpf_task_pt_regs) and up to
 *     PROFILE_STACK_BYTES of the user stack, copied page by page (a single
 *     large read fails whole where the stack ends sooner): user space unwinds
 *     it with DWARF CFI, since neither CPython nor most libraries keep frame
 *     pointers;
 *   - the CPython frame chain, read now because 3.11+ frames live in the
 *     interpreter's data stack and change as soon as the thread runs on: the
 *     offsets come per process (py_procs, otelbpf/profiles/python/offsets.py),
 *     the thread state from the thread's own TLS where user space proved where
 *     it is (tls_thread_state), else per thread (py_tstates, filled by user
 *     space from the interpreter's thread list);
 *   - the kernel stack (kernel_stacks) when the sample is in the kernel;
 *   - the asyncio task the thread is running, to link the sample to its span.
 *
 * GPU profiles (-DGPU_PROFILES=1): gpu_stack_sample takes the same sample at
 * the GPU uprobes (bpf/calls.c CALL_STACK: allocations, copies, waits,
 * collectives; bpf/gpu.c: 1 kernel launch in GPU_LAUNCH_EVERY), kinds
 * PROFILE_GPU_CALL and PROFILE_GPU_LAUNCH.
 *
 * The traced-process filter runs first. Nothing here reads a kernel struct by
 * header layout: the perf context's user registers are the UAPI struct, the
 * task's saved frame is read whole (struct pt_regs, the syscall ABI).
 */
#ifndef PROFILES
#define PROFILES 0
#endif
#if PROFILES
#if defined(__x86_64__)
/* The perf-event program's context (uapi/linux/bpf_perf_event.h, where regs is
 * bpf_user_pt_regs_t, struct pt_regs on x86-64), declared here: through BCC's
 * include paths that header pulls in most of the scheduler's headers, and the
 * compile then costs the agent ~35 MB more peak memory (bench/README.md). */
struct bpf_perf_event_data {
    struct pt_regs regs;
    __u64 sample_period;
    __u64 addr;
};
#else
#include <uapi/linux/bpf_perf_event.h>
#endif

#ifndef PROFILE_RING_PAGES
#define PROFILE_RING_PAGES 2048
#endif
#ifndef PROFILE_SLOTS
#define PROFILE_SLOTS 512 /* 2 x possible CPUs (user space passes it) */
#endif
#ifndef OFF_CPU_SAMPLES
#define OFF_CPU_SAMPLES 0
#endif
#define PROFILE_PAGE 4096
/* x86-64 struct pt_regs: cs and sp words (the user-mode test and the stack). */
#define PT_REGS_CS_WORD 17
#define PT_REGS_SP_WORD 19
#define PY_OFFSET_NONE 0xffffffff
/* The thread pointer's offset in task_struct (thread.fsbase, from the kernel's BTF:
 * otelbpf/profiles/sampler.py); -1: unknown, thread states come from the tid map only. */
#ifndef TASK_FSBASE_OFFSET
#define TASK_FSBASE_OFFSET -1
#endif

struct profile_record {
    struct event_hdr hdr;
    struct profile_info info;
    /* One page more than is copied: the verifier's bound for the last page. */
    __u8 stack[PROFILE_STACK_BYTES + PROFILE_PAGE];
};

struct offcpu_record {
    struct event_hdr hdr;
    struct offcpu_end end;
};

struct offcpu_start {
    __u64 ts_ns;
    __u32 tgid;
    __u32 pad;
};

BPF_HASH(py_procs, __u32, struct py_offsets, 4096);
BPF_HASH(py_tstates, __u32, __u64, 65536);
BPF_STACK_TRACE(kernel_stacks, 8192);
BPF_RINGBUF_OUTPUT(profile_events, PROFILE_RING_PAGES);
/* Scratch per (CPU, kind): a record is ~35 KiB, over the per-CPU value cap. */
BPF_ARRAY(profile_scratch, struct profile_record, PROFILE_SLOTS);
BPF_TABLE("lru_hash", __u32, struct offcpu_start, offcpu_since, 65536);

static __always_inline struct profile_record *profile_slot(int kind)
{
    int index = bpf_get_smp_processor_id() * 2 + kind;
    return profile_scratch.lookup(&index);
}

/* The current thread's PyThreadState read from its TLS (0: none there, or not configured). */
static __always_inline __u64 tls_thread_state(struct py_offsets *o)
{
#if TASK_FSBASE_OFFSET >= 0
    if (o->tstate_mode == PY_TSTATE_MAP)
        return 0;
    __u64 at = 0;
    if (bpf_probe_read_kernel(&at, sizeof(at), (void *)(bpf_get_current_task() + TASK_FSBASE_OFFSET)) != 0 || !at)
        return 0;
    if (o->tstate_mode == PY_TSTATE_DTV) {
        __u64 dtv = 0, block = 0;
        bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(at + 8));
        if (!dtv)
            return 0;
        bpf_probe_read_user(&block, sizeof(block), (void *)(dtv + (__u64)o->tls_module * 16));
        if (!block || block == (__u64)-1) /* TLS_DTV_UNALLOCATED: the thread never touched it */
            return 0;
        at = block;
    }
    __u64 tstate = 0;
    bpf_probe_read_user(&tstate, sizeof(tstate), (void *)(at + o->tls_offset));
    return tstate;
#else
    return 0;
#endif
}

/* Python frames, leaf first, with their eval-call boundaries. */
static __always_inline void read_python_frames(struct profile_record *rec, __u32 tgid, __u32 tid)
{
    struct py_offsets *o = py_procs.lookup(&tgid);
    if (!o)
        return;
    __u64 tstate = tls_thread_state(o);
    if (!tstate) {
        __u64 *listed = py_tstates.lookup(&tid);
        if (!listed) {
            rec->info.flags |= PF_PY_NO_THREAD;
            return;
        }
        tstate = *listed;
    }
    __u64 frame = 0;
    bpf_probe_read_user(&frame, sizeof(frame), (void *)(tstate + o->tstate_frame));
    if (o->cframe_current_frame != PY_OFFSET_NONE && frame)
        bpf_probe_read_user(&frame, sizeof(frame), (void *)(frame + o->cframe_current_frame));
    int count = 0;
    for (int i = 0; i < PROFILE_PY_FRAMES; i++) {
        if (!frame)
            break;
        struct py_frame *f = &rec->info.py[i];
        f->code = 0;
        f->instr = 0;
        f->flags = 0;
        bpf_probe_read_user(&f->code, sizeof(f->code), (void *)(frame + o->frame_code));
        bpf_probe_read_user(&f->instr, sizeof(f->instr), (void *)(frame + o->frame_instr));
        if (o->owner_kind == 0) {
            f->flags = PYF_EVAL_END; /* 3.10: one frame per evaluation call */
        } else if (o->frame_owner != PY_OFFSET_NONE) {
            __u8 owner = 0;
            bpf_probe_read_user(&owner, sizeof(owner), (void *)(frame + o->frame_owner));
            if (o->owner_kind == 1 && owner)
                f->flags = PYF_EVAL_END;
            else if (o->owner_kind == 2 && owner >= o->shim_owner)
                f->flags = PYF_SHIM;
        }
        __u64 previous = 0;
        bpf_probe_read_user(&previous, sizeof(previous), (void *)(frame + o->frame_previous));
        frame = previous;
        count = i + 1;
    }
    if (frame)
        rec->info.flags |= PF_PY_TRUNCATED;
    rec->info.py_count = count;
}

/* The user stack from `sp`, page by page until a read fails or the cap. */
static __always_inline __u32 copy_user_stack(struct profile_record *rec, __u64 sp)
{
    __u32 copied = 0;
    __u32 want = PROFILE_PAGE - (sp & (PROFILE_PAGE - 1));
    for (int i = 0; i <= PROFILE_STACK_BYTES / PROFILE_PAGE; i++) {
        if (copied + want > PROFILE_STACK_BYTES)
            want = PROFILE_STACK_BYTES - copied;
        if (want == 0)
            break;
        BOUND_FOR_VERIFIER(copied, PROFILE_STACK_BYTES);
        BOUND_FOR_VERIFIER(want, PROFILE_PAGE);
        if (bpf_probe_read_user(rec->stack + copied, want, (void *)(sp + copied)) != 0)
            return copied;
        copied += want;
        want = PROFILE_PAGE;
    }
    if (copied >= PROFILE_STACK_BYTES)
        rec->info.flags |= PF_STACK_TRUNCATED;
    return copied;
}

/* Everything but the registers; then submit. */
static __always_inline int finish_sample(struct profile_record *rec, __u64 id, __u64 now, void *stack_ctx, int in_kernel, __u32 weight)
{
    __u32 tgid = id >> 32, tid = (__u32)id;
    rec->hdr.ts_ns = now;
    rec->hdr.tgid = tgid;
    rec->hdr.tid = tid;
    rec->hdr.fd = -1;
    rec->hdr.type = EV_PROFILE;
    rec->hdr.direction = 0;
    rec->hdr.flags = 0;
    rec->hdr.source = 0;
    rec->hdr.total_len = weight; /* PROFILE_GPU_LAUNCH: launches the sample stands for */
    rec->hdr.task_id = thread_task_id(id);
    rec->info.kernel_stack_id = in_kernel ? kernel_stacks.get_stackid(stack_ctx, 0) : -1;
    bpf_get_current_comm(&rec->info.comm, sizeof(rec->info.comm));
    rec->info.py_count = 0;
    read_python_frames(rec, tgid, tid);
    __u32 copied = copy_user_stack(rec, rec->info.regs[PT_REGS_SP_WORD]);
    rec->info.stack_addr = rec->info.regs[PT_REGS_SP_WORD];
    rec->hdr.captured_len = copied;
    __u64 size = sizeof(rec->hdr) + sizeof(rec->info) + copied;
    BOUND_FOR_VERIFIER(size, sizeof(*rec));
    /* On-CPU samples come at --profile-hz on every busy CPU whatever the traffic, and
     * never wake a sleeping agent: it reads them when it wakes, within the time the
     * ring holds them (ProfileSampler.unread_limit_s, otelbpf/profiles/sampler.py). */
    __u64 wakeup = rec->info.kind == PROFILE_ON_CPU ? BPF_RB_NO_WAKEUP : ring_wakeup_flags();
    if (profile_events.ringbuf_output(rec, size, wakeup) != 0) {
        count_stat(STAT_PROFILE_LOST);
        return -1;
    }
    return 0;
}

/* The syscall's saved user registers (a sample or switch in the kernel). */
static __always_inline void saved_user_regs(struct profile_record *rec)
{
    bpf_probe_read_kernel(rec->info.regs, sizeof(rec->info.regs), current_user_regs());
}

int profile_on_cpu(struct bpf_perf_event_data *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    if (tgid == 0 || !is_traced(tgid))
        return 0;
    struct profile_record *rec = profile_slot(PROFILE_ON_CPU);
    if (!rec)
        return 0;
    rec->hdr.conn_id = 0;
    rec->info.kind = PROFILE_ON_CPU;
    rec->info.flags = 0;
    rec->info.gpu_kernel = 0;
    rec->info.gpu_host_function = 0;
    __u64 *sampled = (__u64 *)&ctx->regs;
    int in_kernel = (sampled[PT_REGS_CS_WORD] & 3) != 3;
    if (in_kernel) {
        rec->info.flags |= PF_KERNEL_MODE;
        saved_user_regs(rec);
    } else {
#pragma unroll
        for (int i = 0; i < PROFILE_REGS; i++)
            rec->info.regs[i] = sampled[i];
    }
    finish_sample(rec, id, bpf_ktime_get_ns(), ctx, in_kernel, 0);
    return 0;
}

#if GPU_STACKS
/* One scratch record per CPU for the GPU probes: uprobe programs run with
 * preemption disabled and do not nest on a CPU (nor with the perf-event one). */
BPF_ARRAY(gpu_profile_scratch, struct profile_record, PROFILE_SLOTS / 2);

/* A stack sample at a GPU probe (bpf/calls.c CALL_STACK, bpf/gpu.c launches):
 * `ctx` is the thread's user registers at the probed instruction (a uprobe
 * fires in user mode), so no kernel stack; `ts` keys it to its EV_CALL;
 * `launched` (launches, else NULL): what the launch launched. */
static __always_inline void gpu_stack_sample(struct pt_regs *ctx, __u64 id, __u64 ts, __u8 kind, __u32 weight,
                                             struct gpu_launched *launched)
{
    int index = bpf_get_smp_processor_id();
    struct profile_record *rec = gpu_profile_scratch.lookup(&index);
    if (!rec)
        return;
    rec->hdr.conn_id = 0;
    rec->info.kind = kind;
    rec->info.flags = launched && launched->graph ? PF_GPU_GRAPH : 0;
    rec->info.gpu_kernel = launched ? launched->kernel : 0;
    rec->info.gpu_host_function = launched ? launched->host_function : 0;
    __u64 *regs = (__u64 *)ctx;
#pragma unroll
    for (int i = 0; i < PROFILE_REGS; i++)
        rec->info.regs[i] = regs[i];
    finish_sample(rec, id, ts, ctx, 0, weight);
}
#endif

#if OFF_CPU_SAMPLES
/* prev_state's low byte: 0 is runnable (preempted, not blocked). */
#define BLOCKED_STATE_MASK 0xff
#ifndef OFF_CPU_MIN_NS
#define OFF_CPU_MIN_NS 1000000
#endif

TRACEPOINT_PROBE(sched, sched_switch)
{
    __u64 now = bpf_ktime_get_ns();
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    /* The thread switching out is `current`: sample it if it blocks. */
    if (tgid != 0 && (args->prev_state & BLOCKED_STATE_MASK) && is_traced(tgid)) {
        struct profile_record *rec = profile_slot(PROFILE_OFF_CPU);
        if (rec) {
            rec->hdr.conn_id = now;
            rec->info.kind = PROFILE_OFF_CPU;
            rec->info.flags = PF_KERNEL_MODE;
            rec->info.gpu_kernel = 0;
            rec->info.gpu_host_function = 0;
            saved_user_regs(rec);
            if (finish_sample(rec, id, now, args, 1, 0) == 0) {
                struct offcpu_start since = {.ts_ns = now, .tgid = tgid};
                __u32 tid = (__u32)id;
                offcpu_since.update(&tid, &since);
            }
        }
    }
    /* The thread switching in: how long it was blocked. */
    __u32 next = args->next_pid;
    struct offcpu_start *since = offcpu_since.lookup(&next);
    if (!since)
        return 0;
    struct offcpu_record out = {};
    out.hdr.ts_ns = now;
    out.hdr.conn_id = since->ts_ns;
    out.hdr.tgid = since->tgid;
    out.hdr.tid = next;
    out.hdr.fd = -1;
    out.hdr.type = EV_OFFCPU_END;
    out.end.blocked_ns = now - since->ts_ns;
    offcpu_since.delete(&next);
    if (out.end.blocked_ns < OFF_CPU_MIN_NS)
        return 0;
    if (profile_events.ringbuf_output(&out, sizeof(out), ring_wakeup_flags()) != 0)
        count_stat(STAT_PROFILE_LOST);
    return 0;
}
#endif /* OFF_CPU_SAMPLES */

#endif /* PROFILES */
