/* Rank thread clocks: how long each thread that issues NCCL collectives has
 * been off the CPU, so that user space can split the time between two of its
 * collectives into GPU waits, on-CPU and off-CPU time (docs/gpu.md, "Slow
 * ranks across nodes").
 *
 * A thread joins rank_clocks at its first collective (bpf/calls.c, sites
 * flagged CALL_RANK_CLOCK). From then on, rank_sched_switch (a raw
 * sched_switch tracepoint that user space attaches only once a process maps
 * NCCL: a host without NCCL pays nothing) stamps the moment it switches out
 * and, when it runs again, adds the time it was away to its total. The GPU
 * call probes (sites flagged CALL_CLOCKED) read that total at the call's
 * entry and return and carry both in the record (call_info.off_cpu_*):
 * differences of the total are exact off-CPU times on the kernel's monotonic
 * clock, the same clock as every timestamp in the records. "Off the CPU"
 * counts blocked and runnable-but-preempted time alike.
 *
 * The switching-in task's pid is read from its task_struct at TASK_PID_OFF,
 * an offset user space took from the running kernel's BTF (never a header
 * layout). Without BTF (RANK_CLOCKS=0) nothing here is compiled and the
 * records carry no clock (user space then does not split host time).
 */
#ifndef RANK_CLOCKS
#define RANK_CLOCKS 0
#endif
#if RANK_CLOCKS
#ifndef RANK_CLOCK_THREADS
#define RANK_CLOCK_THREADS 16384
#endif

struct rank_clock {
    __u64 off_cpu_ns;      /* total time off the CPU since the thread joined */
    __u64 switched_out_ns; /* when it last left the CPU (0: it is running) */
};

BPF_TABLE("lru_hash", __u32, struct rank_clock, rank_clocks, RANK_CLOCK_THREADS);

/* A thread that issues a collective: clock it from now on. */
static __always_inline void rank_clock_join(__u32 tid)
{
    struct rank_clock fresh = {};
    rank_clocks.insert(&tid, &fresh); /* no-op when it is there */
}

/* The thread's off-CPU total, when it is clocked. */
static __always_inline int rank_clock_read(__u32 tid, __u64 *off_cpu_ns)
{
    struct rank_clock *clock = rank_clocks.lookup(&tid);
    if (!clock)
        return 0;
    *off_cpu_ns = clock->off_cpu_ns;
    return 1;
}

/* raw_tracepoint/sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 * unsigned int prev_state): user space checked the prototype in BTF before attaching. */
int rank_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
    __u64 now = bpf_ktime_get_ns();
    __u32 prev = (__u32)bpf_get_current_pid_tgid(); /* `current` is the task switching out */
    struct rank_clock *clock = prev ? rank_clocks.lookup(&prev) : 0;
    if (clock)
        clock->switched_out_ns = now;
    __s32 next = 0;
    bpf_probe_read_kernel(&next, sizeof(next), (void *)(ctx->args[2] + TASK_PID_OFF));
    if (next <= 0)
        return 0;
    __u32 next_tid = next;
    clock = rank_clocks.lookup(&next_tid);
    if (clock && clock->switched_out_ns) {
        clock->off_cpu_ns += now - clock->switched_out_ns;
        clock->switched_out_ns = 0;
    }
    return 0;
}
#else
static __always_inline void rank_clock_join(__u32 tid) {}
static __always_inline int rank_clock_read(__u32 tid, __u64 *off_cpu_ns) { return 0; }
#endif
