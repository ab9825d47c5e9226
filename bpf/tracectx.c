/* The thread -> span map other eBPF tools read (--publish-trace-context).
 *
 * OBI's `traces_ctx_v1` format, pinned by name under /sys/fs/bpf: key the
 * thread's pid_tgid (tgid << 32 | tid, as bpf_get_current_pid_tgid gives it),
 * value the trace and span ids of the request the thread is serving. An
 * OpenTelemetry eBPF profiler running beside the agent looks its samples up
 * there and links them to otelbpf's spans. If a map of that name is pinned
 * already (OBI runs too), it is shared, not replaced.
 *
 * No program of the agent reads it: user space writes an entry when a request
 * window opens on a thread and deletes it when the window closes
 * (otelbpf/profiles/tracectx.py), a drain interval (~10 ms) after the fact.
 */
#ifndef PUBLISH_TRACE_CTX
#define PUBLISH_TRACE_CTX 0
#endif
#if PUBLISH_TRACE_CTX
struct obi_ctx_info {
    unsigned char trace_id[16];
    unsigned char span_id[8];
};
BPF_TABLE_PINNED("lru_hash", __u64, struct obi_ctx_info, traces_ctx_v1, 16384, "/sys/fs/bpf/traces_ctx_v1");
#endif
