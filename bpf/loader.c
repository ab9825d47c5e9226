/* The dynamic loader's debugger hook: a traced process loaded (or unloaded) a
 * library. glibc's and musl's ld.so call _dl_debug_state() when they change the
 * link map, for debuggers (r_debug.r_brk): at the start of a dlopen or dlclose
 * (RT_ADD, RT_DELETE) and once the libraries are mapped and relocated, before
 * their constructors run (RT_CONSISTENT). An entry uprobe there, attached per
 * traced process by otelbpf/sources/uprobes.py (spec in
 * otelbpf/sources/loader.py), tells user space to look at the process's maps
 * at once (EV_LIB_LOAD, waking it), instead of at its next connection (at most
 * once a second) or the periodic re-scan (5 s): a CUDA library dlopen()ed late
 * is probed within milliseconds of its load.
 *
 * One event in flight per process: lib_load_pending is set here and cleared by
 * user space before it reads the maps, so a later load (after the clear) sends
 * another event, and a burst of loads (an import that dlopens dozens of
 * extensions) costs a few re-reads, not one per hook call.
 */
BPF_HASH(lib_load_pending, __u32, __u8, 16384);

int lib_loaded(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    if (!is_traced(tgid))
        return 0;
    __u8 one = 1;
    if (lib_load_pending.lookup(&tgid))
        return 0;
    lib_load_pending.update(&tgid, &one);
    struct event_hdr *rec = events.ringbuf_reserve(sizeof(struct event_hdr));
    if (!rec) {
        lib_load_pending.delete(&tgid); /* the next hook call tries again */
        count_stat(STAT_LOST);
        return 0;
    }
    __builtin_memset(rec, 0, sizeof(*rec));
    rec->ts_ns = bpf_ktime_get_ns();
    rec->tgid = tgid;
    rec->tid = (__u32)id;
    rec->fd = -1;
    rec->type = EV_LIB_LOAD;
    events.ringbuf_submit(rec, ring_wakeup_flags()); /* a sleeping agent wakes; a busy one drains within ~10 ms */
    return 0;
}
