/* Records the kernel side hands to otelbpf through the BPF ring buffer.
 *
 * otelbpf/sources/ebpf_layout.py mirrors these layouts with struct.Struct;
 * tests/test_ebpf_record_abi.py checks the two agree (compiled offsets vs Python).
 * Only fixed-width types, explicit padding: the layout is an ABI.
 * Shared by every probe family (bpf/capture.c includes them all).
 */
#ifndef OTELBPF_CAPTURE_H
#define OTELBPF_CAPTURE_H

enum event_type {
    EV_DATA = 1,       /* bytes read or written on a stream socket */
    EV_CONN_OPEN = 2,  /* first sight of (tgid, fd) as a socket */
    EV_CONN_CLOSE = 3, /* close() of a socket we reported */
    EV_PROC_EXIT = 4,  /* a traced process exited */
    EV_CONN_PEER = 5,  /* the peer socket of a Unix connection became known */
    EV_DATAGRAM = 6,   /* one UDP datagram sent or received, with its peer */
    EV_PROC_START = 7, /* a traced process exec()ed */
    EV_CALL = 8,       /* a library call seen by the generic uprobes */
    EV_PROFILE = 9,    /* a stack sample of a traced thread (bpf/profile.c) */
    EV_OFFCPU_END = 10, /* a traced thread ran again after blocking (bpf/profile.c) */
    EV_LIB_LOAD = 11,   /* a traced process's dynamic loader changed its link map (bpf/loader.c) */
    EV_GPU_KERNEL_NAME = 12, /* a GPU kernel handle's name, as CUDA learned it (bpf/gpu_names.c) */
};

enum direction {
    DIR_INGRESS = 0, /* the process read the bytes */
    DIR_EGRESS = 1,  /* the process wrote the bytes */
};

/* Which probe family saw a payload (otelbpf.core.events.Source). */
enum data_source {
    SOURCE_SOCKET = 0, /* socket tracepoints */
    SOURCE_TLS = 1,    /* TLS library uprobes (plaintext) */
};

enum data_flags {
    DF_SENDFILE = 1,      /* moved by sendfile()/splice(): counted, not captured */
    DF_IOV_TRUNCATED = 2, /* more iovecs than the probe walks */
    DF_MMSG_UNKNOWN = 4,  /* a sendmmsg/recvmmsg entry we could not place: counted, not captured */
};

enum role_hint {
    ROLE_UNKNOWN = 0,
    ROLE_ACCEPTED = 1,
    ROLE_CONNECTED = 2,
};

/* Every record starts with this header (48 bytes). */
struct event_hdr {
    __u64 ts_ns;   /* CLOCK_MONOTONIC: when the socket layer moved the bytes */
    __u64 conn_id; /* kernel-assigned, unique per connection sighting */
    __u32 tgid;
    __u32 tid;
    __s32 fd;
    __u8 type;      /* enum event_type */
    __u8 direction; /* enum direction (EV_DATA, EV_DATAGRAM) */
    __u8 flags;     /* enum data_flags (EV_DATA, EV_DATAGRAM) */
    __u8 source;    /* enum data_source (EV_DATA, EV_DATAGRAM) */
    __u32 total_len;    /* bytes the syscall moved (EV_DATA, EV_DATAGRAM) */
    __u32 captured_len; /* bytes of payload following the header (and info) */
    /* EV_DATA, EV_DATAGRAM, EV_CALL: the Python coroutine whose asyncio task
     * step made the call (opaque, 0 when none). */
    __u64 task_id;
};

/* EV_CONN_OPEN and EV_CONN_PEER: header + this (72 bytes) */
struct conn_info {
    __u16 family; /* AF_INET, AF_INET6, AF_UNIX; 0 when the tuple is unknown */
    __u16 local_port;
    __u16 peer_port;
    __u8 role; /* enum role_hint */
    __u8 protocol;
    __u8 local_addr[16]; /* IPv4 in the first 4 bytes */
    __u8 peer_addr[16];
    char comm[16];
    /* Opaque socket identities (kernel sock addresses, never exported):
     * for Unix sockets, the client's peer_sock_id is the server's sock_id,
     * which pairs the two ends of one connection. */
    __u64 sock_id;
    __u64 peer_sock_id;
};

/* EV_DATAGRAM: header + this (24 bytes) + captured_len payload bytes */
struct datagram_info {
    __u16 family;    /* of the peer address; 0 when not known (connected socket) */
    __u16 peer_port; /* host order */
    __u8 protocol;   /* IPPROTO_UDP */
    __u8 pad[3];
    __u8 peer_addr[16]; /* IPv4 in the first 4 bytes */
};

/* EV_PROC_START: header + this (16 + PROC_PATH_LEN bytes) */
#define PROC_PATH_LEN 256
struct proc_info {
    char comm[16];
    /* The exec()ed file as the tracepoint reports it: a short-lived process
     * may be gone before user space reads /proc/PID/exe. */
    char filename[PROC_PATH_LEN];
};

/* call_info.call_flags */
#define CALL_INFO_CLOCKED 1 /* off_cpu_entry_ns/off_cpu_return_ns were read (bpf/ranks.c) */

/* EV_CALL: header (ts_ns = entry) + this (128 bytes) + captured_len payload
 * bytes (the 128-byte ncclUniqueId of a communicator set-up, bpf/calls.c) */
struct call_info {
    __u32 probe_id; /* user space maps it to (library, function) */
    __u32 call_flags; /* CALL_INFO_* */
    __u64 end_ns; /* return time; = entry for entry-only probes */
    __u64 args[6];
    __s64 ret;
    /* GPU calls (bpf/gpu.c): kernel launches on this thread since its last
     * reported call, and when the first of them was made (0: none) */
    __u64 launches;
    __u64 first_launch_ns;
    /* CALL_READS_OUT0: the 8 bytes args[0] points to, read at return (the
     * pointer cudaMalloc/cudaHostAlloc wrote) */
    __u64 out0;
    /* --gpu-launch-time: ns spent inside those launch calls (0: not measured) */
    __u64 launch_ns;
    /* CALL_INFO_CLOCKED: the calling thread's total time off the CPU (bpf/ranks.c)
     * at the call's entry and at its return */
    __u64 off_cpu_entry_ns;
    __u64 off_cpu_return_ns;
    /* NCCL collectives: the call's number on its (process, communicator handle,
     * function) + 1, counted in the kernel at entry (bpf/calls.c); 0: not counted */
    __u64 comm_seq;
};

/* ---- whole capture of marked connections (bpf/common.h emit_whole) ----
 * User space marks a connection whose bodies it needs (conns' `whole`, per
 * source: an exchange on it reports progress, such as an LLM call's stream),
 * and the server endpoint it talks to (socket.c whole_endpoints: the next
 * connections to or from it are marked from their first byte). Then a read or
 * write larger than CAPTURE_BYTES is copied whole, up to WHOLE_CAPTURE_BYTES
 * per call, as several EV_DATA records of the same ts_ns, in order, each
 * flagged DF_PIECE: the usual first record (the first CAPTURE_BYTES), then
 * pieces. That holds for socket reads and writes of one flat buffer (pieces of
 * at most WHOLE_PIECE_BYTES), gathered ones (readv, writev, recvmsg, sendmsg:
 * pieces of at most WHOLE_GATHER_PIECE_BYTES, spanning iovecs as the bytes do,
 * up to MAX_IOV iovecs) and TLS plaintext (SSL_read/SSL_write[_ex], source
 * SOURCE_TLS, flat). Each piece's total_len is the bytes it stands for: its
 * captured_len, except the last one's, which also counts what the bound still
 * cut off (so user space sees the usual `missing` there, and the pieces'
 * total_len add up to the call's); past MAX_IOV iovecs that last piece is
 * also flagged DF_IOV_TRUNCATED. A call whose records would not fit in the
 * ring now is captured as a prefix (unflagged). Other connections keep the
 * prefix capture. */
#define DF_PIECE 8
#ifndef WHOLE_CAPTURE_BYTES
#define WHOLE_CAPTURE_BYTES (256 * 1024)
#endif
#define WHOLE_PIECE_BYTES 16384
#define WHOLE_GATHER_PIECE_BYTES 12288

/* ---- profiles (bpf/profile.c) ---- */

/* How many CPython frames a sample reads (leaf first), and how much of the
 * user stack it copies for DWARF unwinding in user space. */
#define PROFILE_PY_FRAMES 64
#ifndef PROFILE_STACK_BYTES
#define PROFILE_STACK_BYTES 32768
#endif
/* Words of the saved user registers (struct pt_regs on x86-64). */
#define PROFILE_REGS 21

enum profile_kind {
    PROFILE_ON_CPU = 0,  /* the CPU-clock perf event fired on a traced thread */
    PROFILE_OFF_CPU = 1, /* a traced thread blocked (sched_switch); its time comes with EV_OFFCPU_END */
    PROFILE_GPU_CALL = 2, /* at the entry of a GPU call (bpf/calls.c CALL_STACK); ts_ns = its EV_CALL's entry */
    PROFILE_GPU_LAUNCH = 3, /* at 1 kernel launch in N (bpf/gpu.c); total_len = N, the launches it stands for */
};

enum profile_flags {
    PF_KERNEL_MODE = 1,     /* sampled in the kernel: kernel_stack_id is set, regs are the syscall's */
    PF_PY_NO_THREAD = 2,    /* a Python process, but no thread state known for this tid yet */
    PF_PY_TRUNCATED = 4,    /* more Python frames than PROFILE_PY_FRAMES */
    PF_STACK_TRUNCATED = 8, /* the stack copy stopped at PROFILE_STACK_BYTES */
    PF_GPU_GRAPH = 16,      /* PROFILE_GPU_LAUNCH: gpu_kernel is a CUDA graph (cuGraphLaunch) */
};

/* Bits of py_frame.flags, from the interpreter's frame owner/entry field. */
#define PYF_EVAL_END 1 /* the oldest Python frame of one _PyEval_EvalFrameDefault call */
#define PYF_SHIM 2     /* a C-stack shim frame (3.12+): not shown */

struct py_frame {
    __u64 code;  /* PyCodeObject* (f_code / f_executable) */
    __u64 instr; /* 3.11+: instruction pointer; 3.10: f_lasti */
    __u64 flags; /* PYF_* */
};

/* What a sample needs to walk a CPython process's frames (the py_procs map, one per
 * tgid; otelbpf/profiles/python/offsets.py PY_OFFSETS packs it). */
struct py_offsets {
    __u32 version;              /* major << 8 | minor */
    __u32 tstate_frame;         /* PyThreadState -> frame / cframe / current_frame */
    __u32 cframe_current_frame; /* _PyCFrame -> current_frame (3.11, 3.12), else NONE */
    __u32 frame_previous;
    __u32 frame_code;
    __u32 frame_instr;
    __u32 frame_owner;          /* is_entry (3.11) / owner (3.12+), else NONE */
    __u32 owner_kind;           /* 0 none (3.10), 1 is_entry, 2 owner >= shim_owner is a shim */
    __u32 shim_owner;           /* FRAME_OWNED_BY_CSTACK: 3 (3.12+; 3.14 adds 4, also a C frame) */
    __u32 tstate_mode;          /* PY_TSTATE_*: where the thread's PyThreadState is */
    __u32 tls_module;           /* PY_TSTATE_DTV: the interpreter file's TLS module id */
    __u32 pad;
    __s64 tls_offset;           /* PY_TSTATE_FS: from fsbase; PY_TSTATE_DTV: in the module's block */
};

/* py_offsets.tstate_mode: where a thread's PyThreadState is (otelbpf/profiles/python/thread_local.py).
 * From the thread's own TLS (its thread pointer, task->thread.fsbase), its first sample
 * has its Python frames; the tid map is filled from the interpreter's thread list. */
#define PY_TSTATE_MAP 0 /* the py_tstates map only */
#define PY_TSTATE_FS 1  /* *(fsbase + tls_offset): the PyGILState pthread key's slot, or static TLS */
#define PY_TSTATE_DTV 2 /* *(*(*(fsbase + 8) + 16 * tls_module) + tls_offset): a shared libpython's TLS */

/* EV_PROFILE: header (ts_ns, tgid, tid, task_id; captured_len = stack bytes)
 * + this + captured_len bytes of the user stack from stack_addr up. For
 * PROFILE_OFF_CPU, conn_id holds the switch-out time its EV_OFFCPU_END names. */
struct profile_info {
    __u64 stack_addr;       /* the user stack pointer at the sample */
    __s32 kernel_stack_id;  /* in kernel_stacks, or < 0 */
    __u16 py_count;         /* valid entries of py[] */
    __u8 kind;              /* enum profile_kind */
    __u8 flags;             /* enum profile_flags */
    char comm[16];          /* the thread's name */
    /* PROFILE_GPU_LAUNCH (0 otherwise): the handle the driver's launch call was given (a
     * CUfunction or CUkernel, or with PF_GPU_GRAPH a CUgraphExec), and the function the
     * runtime's launch call was given when it came through the runtime (cudaLaunchKernel's
     * func: a kernel's host function, or CUDA 13's cudaKernel_t; 0: none). */
    __u64 gpu_kernel;
    __u64 gpu_host_function;
    __u64 regs[PROFILE_REGS];
    struct py_frame py[PROFILE_PY_FRAMES];
};

/* EV_OFFCPU_END: header (ts_ns = when it ran again, tgid, tid, conn_id = the
 * switch-out time of its EV_PROFILE) + this */
struct offcpu_end {
    __u64 blocked_ns;
};

/* Where a GPU kernel's name was learned (bpf/gpu_names.c). */
enum gpu_name_source {
    GPU_NAME_MODULE_FUNCTION = 1, /* cuModuleGetFunction: a CUfunction by name (JIT, Triton, driver API) */
    GPU_NAME_LIBRARY_KERNEL = 2,  /* cuLibraryGetKernel: a CUkernel by name (the runtime's lazy loading) */
    GPU_NAME_KERNEL_FUNCTION = 3, /* cuKernelGetFunction: a CUfunction standing for a CUkernel (alias) */
    GPU_NAME_REGISTERED = 4,      /* __cudaRegisterFunction: a host function and its kernel's name */
    GPU_NAME_RUNTIME_KERNEL = 5,  /* __cudaGetKernel (CUDA 13): a cudaKernel_t standing for a host function (alias) */
};
#define GPU_NAME_BYTES 256

/* EV_GPU_KERNEL_NAME (the profile ring): header (ts_ns, tgid, tid; captured_len = the name's
 * length, 0 for an alias) + this. A name of GPU_NAME_BYTES - 1 bytes may go on, and one the
 * probe could not read (its page not in memory yet) is empty: user space reads them at name_addr. */
struct gpu_kernel_name {
    __u64 handle;    /* what launches pass: a CUfunction, CUkernel, host function or cudaKernel_t */
    __u64 alias;     /* an alias: the handle `handle` stands for (0: a name) */
    __u64 name_addr; /* where the name is in the process */
    __u8 source;     /* enum gpu_name_source */
    __u8 pad[7];
    char name[GPU_NAME_BYTES]; /* NUL-terminated */
};

/* Indexes of the per-CPU counter array `stats`. */
enum stat_index {
    STAT_LOST = 0,          /* ring buffer full: records dropped */
    STAT_IO_MAP_FULL = 1,   /* too much in flight to remember (pending maps full) */
    STAT_NO_TUPLE = 2,      /* connection opened without a known tuple */
    STAT_MMSG_UNKNOWN = 3,  /* mmsg datagrams we could not place in their array: counted only */
    STAT_CALL_DEPTH = 4,    /* nested probed calls deeper than the per-thread stack */
    STAT_TLS_UNATTRIBUTED = 5, /* TLS plaintext with no connection to attribute it to: dropped */
    STAT_PROFILE_LOST = 6,  /* profile ring full: stack samples dropped */
    /* cross-node trace context (bpf/propagate.c) */
    STAT_CTX_WRITTEN = 7,   /* TCP options written on a request's first segment (retransmits too) */
    STAT_CTX_NO_SPACE = 8,  /* a request's option did not fit (SACK blocks, MD5) or was refused */
    STAT_CTX_READ = 9,      /* TCP options read from a traced server's segments */
    STAT_CTX_ADOPTED = 10,  /* requests whose server adopted the context that came with them */
    STAT_CTX_UNPLACED = 11, /* options that came on no request's first byte (pipelined reads): not adopted */
    STAT_CTX_MISSING = 12,  /* requests without one on a connection that carried contexts before (stripped?) */
    STAT_COUNT = 13,
};

/* ---- cross-node trace context (bpf/propagate.c, docs/cross-node.md) ----
 * An EV_DATA record flagged DF_TRACE_CTX carries a struct trace_ctx after its
 * captured_len bytes of payload: the ids the kernel fixed for a request at the
 * moment it was read (server) or written (client), which user space adopts. */
#define DF_TRACE_CTX 16

enum ctx_origin {
    CTX_FRESH = 1,      /* server: no context came with the request: a new trace */
    CTX_TCP_OPTION = 2, /* server: the TCP option on the request's first segment */
    CTX_HEADER = 3,     /* server: the request's traceparent header (plaintext HTTP/1) */
    CTX_CLIENT = 4,     /* client: what this request carries on the wire */
};

enum ctx_rule { /* client: where the kernel took the trace from (otelbpf.association's names) */
    CTX_RULE_ROOT = 0,    /* the process served no request: a new trace */
    CTX_RULE_THREAD = 1,  /* the one request the writing thread read and has not answered */
    CTX_RULE_PROCESS = 2, /* the one request its process serves (a worker thread's call) */
};

enum ctx_carrier { /* client: where the context goes on the wire (bits) */
    CARRIER_TCP_OPTION = 1,
};

struct trace_ctx {
    __u8 trace_id[16];
    __u8 span_id[8]; /* client: its own span's id (the server's parent); server: the parent's, 0 for CTX_FRESH */
    __u8 flags;      /* W3C trace-flags (bit 0: sampled) */
    __u8 origin;     /* enum ctx_origin */
    __u8 rule;       /* enum ctx_rule (client) */
    __u8 carriers;   /* enum ctx_carrier bits (client) */
    __u32 pad;
};

#endif
