/* GPU kernel launches, counted per thread in the kernel (never one record per
 * launch: a transformer makes thousands a second). Entry-only uprobes on the
 * driver's launch functions (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch: the driver sees every launch once,
 * the runtime's cudaLaunchKernel misses cuBLAS and Triton ones) run
 * gpu_launch_enter; the count is read and reset by the next GPU timeline call
 * the thread makes (bpf/calls.c, CALL_TAKES_LAUNCHES), which carries it to
 * user space in its record (call_info.launches). Counts are kept per (thread,
 * asyncio task): on an event-loop thread the launches of interleaved task
 * steps (an `async def` handler calling CUDA) stay with their task, whose next
 * timeline call takes them (py_current, bpf/pytasks.c; 0 outside a task
 * step). Entry-only because a return
 * probe costs ~4.5 us on a ~9 us launch (measured on an H100; docs/gpu.md), so
 * the time spent in launch calls is not measured.
 */
struct gpu_launch_count {
    __u64 count;
    __u64 first_ns; /* the first launch since the last reset */
};

struct gpu_launch_key {
    __u32 tid;
    __u32 pad;
    __u64 task; /* the asyncio task (coroutine) running, 0: none */
};

/* LRU: a thread (or task) that ends with launches not yet reported does not hold a slot forever */
BPF_TABLE("lru_hash", struct gpu_launch_key, struct gpu_launch_count, gpu_launches, 16384);

int gpu_launch_enter(struct pt_regs *ctx)
{
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    struct gpu_launch_key key = {.tid = tid, .task = current_task_id(tid)};
    struct gpu_launch_count *count = gpu_launches.lookup(&key);
    if (count) {
        if (count->count == 0)
            count->first_ns = bpf_ktime_get_ns();
        count->count += 1; /* one thread: no concurrent update */
        return 0;
    }
    struct gpu_launch_count first = {.count = 1, .first_ns = bpf_ktime_get_ns()};
    gpu_launches.update(&key, &first);
    return 0;
}

/* Move the launch count of the thread's current task (0: none) into `info` and reset it. */
static __always_inline void gpu_take_launches(__u32 tid, __u64 task, struct call_info *info)
{
    struct gpu_launch_key key = {.tid = tid, .task = task};
    struct gpu_launch_count *count = gpu_launches.lookup(&key);
    if (!count || count->count == 0)
        return;
    info->launches = count->count;
    info->first_launch_ns = count->first_ns;
    count->count = 0;
    count->first_ns = 0;
}
