/* Process lifecycle (sched:* tracepoints): keeps traced_tgids right for new
 * processes, reports traced processes' exec (EV_PROC_START) and exit
 * (EV_PROC_EXIT). Included by capture.c after common.h. */

struct proc_record {
    struct event_hdr hdr;
    struct proc_info info;
};

#if PROPAGATION
/* bpf/propagate.c: what a thread or process served goes with it. */
static __always_inline void prop_task_exit(__u32 tgid, __u32 tid, int group_dead);
#endif

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    /* Runs in the parent. A child inherits the parent's reason to be
     * traced. child_pid may be a thread of the same process: that entry is
     * harmless and goes away when the thread exits (sched_process_exit). */
    __u32 parent_tgid = bpf_get_current_pid_tgid() >> 32;
    __u8 reason = traced_reason(parent_tgid);
    if (reason) /* the USES_* bits too: a forked worker keeps the parent's libraries and loop */
        set_traced(args->child_pid, reason | process_uses(parent_tgid));
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    /* The comm is the new program's by now: (un)trace by --comm. */
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    struct comm_key key = {};
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    __u8 reason = traced_reason(tgid);
    set_traced(tgid, reason); /* a new program: its USES_* bits start afresh */
    if (reason != EXCLUDED_BY_PID && comm_excluded(key.comm)) {
        set_traced(tgid, EXCLUDED_BY_COMM);
        return 0;
    }
    if (reason == EXCLUDED_BY_COMM) {
        reason = 0; /* the new program is not excluded: decide afresh */
        set_traced(tgid, 0);
    }
    if (reason == EXCLUDED_BY_PID) {
        return 0;
    } else if (traced_comms.lookup(&key)) {
        if (!reason)
            set_traced(tgid, TRACED_BY_COMM);
    } else if (reason == TRACED_BY_COMM) {
        set_traced(tgid, 0);
    }
    if (!is_traced(tgid))
        return 0;
    struct proc_record *rec = events.ringbuf_reserve(sizeof(struct proc_record));
    if (!rec) {
        count_stat(STAT_LOST);
        return 0;
    }
    __builtin_memset(rec, 0, sizeof(*rec));
    rec->hdr.ts_ns = bpf_ktime_get_ns();
    rec->hdr.tgid = tgid;
    rec->hdr.tid = (__u32)id;
    rec->hdr.fd = -1;
    rec->hdr.type = EV_PROC_START;
    __builtin_memcpy(rec->info.comm, key.comm, sizeof(key.comm));
    /* __data_loc: offset (low 16 bits) of the string in the tracepoint record. */
    bpf_probe_read_kernel_str(rec->info.filename, sizeof(rec->info.filename),
                              (void *)args + (args->data_loc_filename & 0xFFFF));
    events.ringbuf_submit(rec, ring_wakeup_flags());
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    __u32 tid = (__u32)id;
    if (traced_reason(tgid) >= EXCLUDED_BY_COMM) {
        set_traced(tid, 0); /* a reused pid starts afresh */
        return 0;
    }
    if (!is_traced(tgid))
        return 0;
    set_traced(tid, 0);
#if PROPAGATION
    prop_task_exit(tgid, tid, args->group_dead);
#endif
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
    events.ringbuf_submit(rec, ring_wakeup_flags());
    return 0;
}
