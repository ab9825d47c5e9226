/* GPU kernel launches, counted per thread in the kernel (never one record per
 * launch: a transformer makes thousands a second). Entry uprobes on the
 * driver's launch functions (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch: the driver sees every launch once,
 * the runtime's cudaLaunchKernel misses cuBLAS and Triton ones) count them
 * twice over:
 *  - per (thread, asyncio task) (gpu_launches): read and reset by the next GPU
 *    timeline call the thread makes (bpf/calls.c, CALL_TAKES_LAUNCHES), which
 *    carries the count to user space in its record (call_info.launches): the
 *    request span's count. On an event-loop thread the launches of
 *    interleaved task steps (an `async def` handler calling CUDA) stay with
 *    their task, whose next timeline call takes them (py_current,
 *    bpf/pytasks.c; 0 outside a task step);
 *  - per process (gpu_launch_totals, monotonic): read by user space at each
 *    metrics collection and at the process's exit (otelbpf/sources/gpu.py),
 *    so launches no timeline call follows are counted too.
 * By default the probes are entry-only (gpu_launch_enter): a return probe
 * costs ~4.5 us on a ~9 us launch (measured on an H100; docs/gpu.md). With
 * --gpu-launch-time, gpu_launch_enter_timed and gpu_launch_return also sum the
 * time spent inside the outermost launch call per thread and task
 * (call_info.launch_ns) and per process, still without a record per launch.
 */
struct gpu_launch_count {
    __u64 count;
    __u64 first_ns;   /* the first launch since the last reset */
    __u64 time_ns;    /* --gpu-launch-time: ns inside launch calls since the last reset */
    __u64 entered_ns; /* --gpu-launch-time: entry of the outermost launch call in progress */
    __u32 depth;      /* --gpu-launch-time: launch calls in progress on the thread */
    __u32 until_sample; /* GPU profiles: launches left before the next stack sample (0: not started) */
};

struct gpu_launch_total {
    __u64 count;
    __u64 time_ns;
};

struct gpu_launch_key {
    __u32 tid;
    __u32 pad;
    __u64 task; /* the asyncio task (coroutine) running, 0: none */
};

#ifndef GPU_PROFILES
#define GPU_PROFILES 0
#endif
/* GPU profiles (bpf/profile.c): 1 launch in GPU_LAUNCH_EVERY per (thread, task) takes a stack
 * sample weighted by GPU_LAUNCH_EVERY (0: launches take none). */
#ifndef GPU_LAUNCH_EVERY
#define GPU_LAUNCH_EVERY 0
#endif
/* What a sampled launch launched (bpf/profile.c puts it in the sample): the handle the driver's
 * launch call was given, and the function the runtime's launch call was given when the launch
 * came through it (its host stub's address, or CUDA 13's cudaKernel_t; 0: none). */
struct gpu_launched {
    __u64 kernel;
    __u64 host_function;
    __u8 graph; /* the handle is a CUgraphExec (cuGraphLaunch): a replay of many kernels */
};

#if defined(PROFILES) && PROFILES && GPU_PROFILES
/* Defined in bpf/profile.c (included after this file): a stack sample of the
 * calling thread at a GPU probe, `ctx` being its user registers. */
static __always_inline void gpu_stack_sample(struct pt_regs *ctx, __u64 id, __u64 ts, __u8 kind, __u32 weight,
                                             struct gpu_launched *launched);
#define GPU_STACKS 1
#else
#define GPU_STACKS 0
static __always_inline void gpu_stack_sample(struct pt_regs *ctx, __u64 id, __u64 ts, __u8 kind, __u32 weight,
                                             struct gpu_launched *launched) {}
#endif

/* LRU: a thread (or task) that ends with launches not yet reported does not hold a slot forever */
BPF_TABLE("lru_hash", struct gpu_launch_key, struct gpu_launch_count, gpu_launches, 16384);
/* By tgid; user space deletes a process's entry when it has read it at the process's exit */
BPF_HASH(gpu_launch_totals, __u32, struct gpu_launch_total, 16384);

static __always_inline struct gpu_launch_total *gpu_process_total(__u32 tgid)
{
    struct gpu_launch_total *total = gpu_launch_totals.lookup(&tgid);
    if (total)
        return total;
    struct gpu_launch_total zero = {};
    gpu_launch_totals.insert(&tgid, &zero); /* fails harmlessly if another thread of the process won */
    return gpu_launch_totals.lookup(&tgid);
}

/* Count one launch for the thread's current task and its process; the task's entry. */
static __always_inline struct gpu_launch_count *gpu_count_launch(__u64 id, __u64 now)
{
    __u32 tid = (__u32)id;
    struct gpu_launch_total *total = gpu_process_total(id >> 32);
    if (total)
        __sync_fetch_and_add(&total->count, 1); /* threads of one process on several CPUs */
    struct gpu_launch_key key = {.tid = tid, .task = thread_task_id(id)};
    struct gpu_launch_count *count = gpu_launches.lookup(&key);
    if (count) {
        if (count->count == 0)
            count->first_ns = now;
        count->count += 1; /* one thread: no concurrent update */
        return count;
    }
    struct gpu_launch_count first = {.count = 1, .first_ns = now};
    gpu_launches.update(&key, &first);
    return gpu_launches.lookup(&key);
}

#if GPU_STACKS && GPU_LAUNCH_EVERY > 0
#define GPU_KERNEL_NAMES 1
/* The function the runtime's launch call (cudaLaunchKernel...) was given, for the driver launch
 * it makes next: per CPU (a uprobe handler is not preempted, and the runtime call and the driver
 * call it makes run back to back on one thread), checked by thread and age when read. */
struct gpu_runtime_launch {
    __u32 tid;
    __u32 pad;
    __u64 function;
    __u64 ts;
};
BPF_PERCPU_ARRAY(gpu_runtime_launches, struct gpu_runtime_launch, 1);
/* A runtime launch reaches its driver launch within microseconds: an older note is not its. */
#define GPU_RUNTIME_LAUNCH_NS 1000000

static __always_inline void gpu_note_runtime_launch(__u64 function)
{
    int zero = 0;
    struct gpu_runtime_launch *note = gpu_runtime_launches.lookup(&zero);
    if (!note)
        return;
    note->tid = (__u32)bpf_get_current_pid_tgid();
    note->function = function;
    note->ts = bpf_ktime_get_ns();
}

/* The runtime function noted on this CPU for this thread's driver launch now (0: none), taken once. */
static __always_inline __u64 gpu_take_runtime_launch(__u32 tid, __u64 now)
{
    int zero = 0;
    struct gpu_runtime_launch *note = gpu_runtime_launches.lookup(&zero);
    if (!note || note->tid != tid || note->function == 0 || now - note->ts > GPU_RUNTIME_LAUNCH_NS)
        return 0;
    __u64 function = note->function;
    note->function = 0;
    return function;
}

/* cudaLaunchKernel, cudaLaunchCooperativeKernel (and _ptsz): the function is the first argument. */
int gpu_runtime_launch_enter(struct pt_regs *ctx)
{
    if (is_traced(bpf_get_current_pid_tgid() >> 32))
        gpu_note_runtime_launch(PT_REGS_PARM1(ctx));
    return 0;
}

/* cudaLaunchKernelExC(config, func, args) (and _ptsz): the second. */
int gpu_runtime_launch_ex_enter(struct pt_regs *ctx)
{
    if (is_traced(bpf_get_current_pid_tgid() >> 32))
        gpu_note_runtime_launch(PT_REGS_PARM2(ctx));
    return 0;
}
#else
#define GPU_KERNEL_NAMES 0
#endif

/* GPU profiles: every GPU_LAUNCH_EVERY-th launch of a (thread, task) takes a stack sample, with
 * what it launched: `kernel` (the driver call's handle) and the runtime call's function. */
static __always_inline void gpu_maybe_sample_launch(struct pt_regs *ctx, struct gpu_launch_count *count, __u64 id, __u64 now,
                                                    __u64 kernel, __u8 graph)
{
#if GPU_KERNEL_NAMES
    if (!count)
        return;
    __u32 left = count->until_sample;
    if (left == 0)
        left = GPU_LAUNCH_EVERY; /* a new (thread, task): its GPU_LAUNCH_EVERY-th launch is sampled */
    left -= 1;
    if (left == 0) {
        count->until_sample = GPU_LAUNCH_EVERY;
        struct gpu_launched launched = {.kernel = kernel, .graph = graph};
        launched.host_function = graph ? 0 : gpu_take_runtime_launch((__u32)id, now);
        gpu_stack_sample(ctx, id, now, PROFILE_GPU_LAUNCH, GPU_LAUNCH_EVERY, &launched);
    } else {
        count->until_sample = left;
    }
#endif
}

static __always_inline int gpu_launch(struct pt_regs *ctx, __u64 kernel, __u8 graph)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u64 now = bpf_ktime_get_ns();
    struct gpu_launch_count *count = gpu_count_launch(id, now);
    gpu_maybe_sample_launch(ctx, count, id, now, kernel, graph);
    return 0;
}

/* --gpu-launch-time: count, and note when the outermost launch call began. */
static __always_inline int gpu_launch_timed(struct pt_regs *ctx, __u64 kernel, __u8 graph)
{
    __u64 now = bpf_ktime_get_ns();
    __u64 id = bpf_get_current_pid_tgid();
    struct gpu_launch_count *count = gpu_count_launch(id, now);
    if (!count)
        return 0;
    gpu_maybe_sample_launch(ctx, count, id, now, kernel, graph);
    if (count->depth == 0)
        count->entered_ns = now;
    count->depth += 1;
    return 0;
}

/* One entry program per place the launched handle is passed (otelbpf/sources/gpu.py LAUNCH_SHAPES):
 * cuLaunchKernel(f, ...) and cuLaunchCooperativeKernel(f, ...): the first argument; cuLaunchKernelEx
 * (config, f, ...): the second; cuGraphLaunch(exec, stream): a graph, the first. */
int gpu_launch_enter(struct pt_regs *ctx) { return gpu_launch(ctx, PT_REGS_PARM1(ctx), 0); }
int gpu_launch_ex_enter(struct pt_regs *ctx) { return gpu_launch(ctx, PT_REGS_PARM2(ctx), 0); }
int gpu_graph_launch_enter(struct pt_regs *ctx) { return gpu_launch(ctx, PT_REGS_PARM1(ctx), 1); }
int gpu_launch_enter_timed(struct pt_regs *ctx) { return gpu_launch_timed(ctx, PT_REGS_PARM1(ctx), 0); }
int gpu_launch_ex_enter_timed(struct pt_regs *ctx) { return gpu_launch_timed(ctx, PT_REGS_PARM2(ctx), 0); }
int gpu_graph_launch_enter_timed(struct pt_regs *ctx) { return gpu_launch_timed(ctx, PT_REGS_PARM1(ctx), 1); }

/* --gpu-launch-time: the outermost launch call returned: add its time (a
 * launch call is synchronous, so the task at its return is the one at its entry). */
int gpu_launch_return(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)id;
    struct gpu_launch_key key = {.tid = tid, .task = thread_task_id(id)};
    struct gpu_launch_count *count = gpu_launches.lookup(&key);
    if (!count || count->depth == 0)
        return 0;
    count->depth -= 1;
    if (count->depth != 0 || count->entered_ns == 0)
        return 0;
    __u64 spent = bpf_ktime_get_ns() - count->entered_ns;
    count->entered_ns = 0;
    count->time_ns += spent;
    __u32 tgid = id >> 32;
    struct gpu_launch_total *total = gpu_launch_totals.lookup(&tgid);
    if (total)
        __sync_fetch_and_add(&total->time_ns, spent);
    return 0;
}

/* Move the launch count (and time) of the thread's current task (0: none) into `info` and reset them. */
static __always_inline void gpu_take_launches(__u32 tid, __u64 task, struct call_info *info)
{
    struct gpu_launch_key key = {.tid = tid, .task = task};
    struct gpu_launch_count *count = gpu_launches.lookup(&key);
    if (!count || count->count == 0)
        return;
    info->launches = count->count;
    info->first_launch_ns = count->first_ns;
    info->launch_ns = count->time_ns;
    count->count = 0;
    count->first_ns = 0;
    count->time_ns = 0;
}

