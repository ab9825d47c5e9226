/* GPU kernel names, where CUDA says them, for the kernel frames of sampled launches
 * (otelbpf/profiles/gpu_kernels.py keeps them per process). Compiled in with launch samples
 * (GPU_KERNEL_NAMES, bpf/gpu.c); after bpf/profile.c, whose ring carries them.
 *
 * A handle's name as the driver or the runtime learns it is sent once (EV_GPU_KERNEL_NAME in
 * the profile ring, no wake-up: it is read with the launch samples that need it):
 *  - cuModuleGetFunction(CUfunction *out, CUmodule, const char *name) and cuLibraryGetKernel
 *    (CUkernel *out, CUlibrary, const char *name): the handle written to *out, read at return;
 *  - cuKernelGetFunction(CUfunction *out, CUkernel k) and CUDA 13's __cudaGetKernel
 *    (cudaKernel_t *out, const void *hostFun): *out stands for k, or for hostFun (an alias);
 *  - __cudaRegisterFunction(handle, const char *hostFun, char *deviceFun, ...): the host
 *    function launches pass, and the kernel's name, at entry (nvcc's constructors run it when
 *    a library loads, so it is seen for libraries loaded while libcudart is probed).
 * Attached per process by otelbpf/sources/gpu.py (NAME_SPECS); every handler filters the traced
 * process first. */
#if GPU_KERNEL_NAMES
struct gpu_name_call {
    __u64 out;
    __u64 argument; /* the name (GPU_NAME_MODULE/LIBRARY) or the handle it stands for (aliases) */
    __u32 source;
    __u32 pad;
};
BPF_HASH(gpu_name_calls, __u32, struct gpu_name_call, 4096);

struct gpu_name_record {
    struct event_hdr hdr;
    struct gpu_kernel_name name;
};

/* Send a name (or an alias: `name_addr` 0) for `handle`. */
static __always_inline void gpu_send_name(__u64 id, __u64 handle, __u64 alias, __u64 name_addr, __u8 source)
{
    struct gpu_name_record *rec = profile_events.ringbuf_reserve(sizeof(struct gpu_name_record));
    if (!rec) {
        count_stat(STAT_PROFILE_LOST);
        return;
    }
    __builtin_memset(rec, 0, sizeof(rec->hdr) + 32);
    rec->hdr.ts_ns = bpf_ktime_get_ns();
    rec->hdr.tgid = id >> 32;
    rec->hdr.tid = (__u32)id;
    rec->hdr.fd = -1;
    rec->hdr.type = EV_GPU_KERNEL_NAME;
    rec->name.handle = handle;
    rec->name.alias = alias;
    rec->name.name_addr = name_addr;
    rec->name.source = source;
    rec->name.name[0] = 0;
    long copied = 0;
    if (name_addr) /* fails where the page is not in yet (a library's rodata at its constructor): user space reads it */
        copied = bpf_probe_read_user_str(rec->name.name, sizeof(rec->name.name), (void *)name_addr);
    rec->hdr.captured_len = copied > 0 ? copied - 1 : 0; /* without the NUL */
    profile_events.ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
}

static __always_inline int gpu_name_call_enter(struct pt_regs *ctx, __u64 argument, __u32 source)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (!is_traced(id >> 32))
        return 0;
    __u32 tid = (__u32)id;
    struct gpu_name_call call = {.out = PT_REGS_PARM1(ctx), .argument = argument, .source = source};
    gpu_name_calls.update(&tid, &call);
    return 0;
}

int gpu_name_module_enter(struct pt_regs *ctx) { return gpu_name_call_enter(ctx, PT_REGS_PARM3(ctx), GPU_NAME_MODULE_FUNCTION); }
int gpu_name_library_enter(struct pt_regs *ctx) { return gpu_name_call_enter(ctx, PT_REGS_PARM3(ctx), GPU_NAME_LIBRARY_KERNEL); }
int gpu_name_kernel_function_enter(struct pt_regs *ctx) { return gpu_name_call_enter(ctx, PT_REGS_PARM2(ctx), GPU_NAME_KERNEL_FUNCTION); }
int gpu_name_runtime_kernel_enter(struct pt_regs *ctx) { return gpu_name_call_enter(ctx, PT_REGS_PARM2(ctx), GPU_NAME_RUNTIME_KERNEL); }

/* The return of any of the four: the handle the call wrote, if it succeeded (returned 0). */
int gpu_name_return(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)id;
    struct gpu_name_call *call = gpu_name_calls.lookup(&tid);
    if (!call)
        return 0;
    struct gpu_name_call done = *call;
    gpu_name_calls.delete(&tid);
    __u64 handle = 0;
    if (PT_REGS_RC(ctx) != 0 || !done.out || bpf_probe_read_user(&handle, sizeof(handle), (void *)done.out) != 0 || !handle)
        return 0;
    if (done.source == GPU_NAME_KERNEL_FUNCTION || done.source == GPU_NAME_RUNTIME_KERNEL)
        gpu_send_name(id, handle, done.argument, 0, done.source);
    else
        gpu_send_name(id, handle, 0, done.argument, done.source);
    return 0;
}

int gpu_name_registered_enter(struct pt_regs *ctx)
{
    __u64 id = bpf_get_current_pid_tgid();
    if (is_traced(id >> 32) && PT_REGS_PARM2(ctx))
        gpu_send_name(id, PT_REGS_PARM2(ctx), 0, PT_REGS_PARM3(ctx), GPU_NAME_REGISTERED);
    return 0;
}
#endif /* GPU_KERNEL_NAMES */
