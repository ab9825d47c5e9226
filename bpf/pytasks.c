/* CPython asyncio task steps: which coroutine a task step is running.
 *
 * CPython's _asyncio runs every task step through the exported C function
 * PyIter_Send(coro, ...) (Python >= 3.10). Nested awaits call it again from
 * the interpreter, so only the outermost call on a thread is a task step:
 * its coroutine is the task's, and any syscall until it returns is made on
 * that task's behalf (py_current, common.h). Attached per traced Python
 * process, by pid, through otelbpf/sources/uprobes.py (spec in
 * python_tasks.py), so other processes never hit the breakpoint. The
 * coroutine pointer is the first argument register: no struct layout.
 */
BPF_HASH(py_depth, __u32, __u32, 16384);

int py_send_enter(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)id;
    __u32 zero = 0;
    __u32 *depth = py_depth.lookup_or_try_init(&tid, &zero);
    if (!depth)
        return 0;
    if (*depth == 0) {
        mark_process_uses(id >> 32, USES_TASKS); /* before py_current: socket events look there only then */
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
