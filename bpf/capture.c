/* otelbpf kernel side: the one file BCC compiles. It includes the shared
 * part and one file per probe family:
 *
 *   capture.h   the record ABI (ring-buffer layouts; ebpf_layout.py mirrors it)
 *   common.h    parameters, maps shared by all families, the traced-process
 *               filter, the saved-user-register helpers
 *   proc.c      process lifecycle (sched:*): who is traced, EV_PROC_START/EXIT
 *   socket.c    socket payload capture (sock:sock_{recv,send}_length + the
 *               per-syscall tracepoints of close/connect/accept/mmsg/recv exits)
 *   pytasks.c   CPython asyncio task steps (uprobes on PyIter_Send)
 *   ranks.c     off-CPU clocks of the threads that issue NCCL collectives
 *   loader.c    the dynamic loader's debugger hook: a library was loaded (EV_LIB_LOAD)
 *   calls.c     generic library call probes (uprobes): EV_CALL
 *   tls.c       TLS plaintext (uprobes on OpenSSL SSL_read/SSL_write[_ex])
 *   profile.c   stack samples for profiles (CPU-clock perf event, sched_switch)
 *   gpu_names.c GPU kernel names for launch samples (uprobes on module, library, registration calls)
 *   tracectx.c  the thread -> span map other eBPF tools read (traces_ctx_v1)
 *   propagate.c cross-node trace context: ids fixed at a request's read and
 *               write, a TCP option on the wire (PROPAGATION only)
 *
 * Design rules (DEVELOPERS.md): tracepoints and uprobes only (no kprobes or
 * fentry on this class of kernels), no kernel struct dereferenced by header
 * layout, every handler filters the traced process first, records are
 * submitted without waking the consumer (BPF_RB_NO_WAKEUP) unless it sleeps
 * on an empty ring (ring_wakeup_flags, common.h).
 *
 * Compile-time parameters (-D): CAPTURE_BYTES (power of two), RINGBUF_PAGES,
 * MAX_IOV, CAPTURE_UNIX, CAPTURE_UDP, CAPTURE_TLS, HAVE_SK_DATA_READY, PID_MAX,
 * REG_* (per-arch saved-register offsets, from ebpf_layout.SYSCALL_REGS),
 * PROPAGATION and TCP_*_SEQ_OFF (struct tcp_sock's offsets, from BTF).
 */
#include "common.h"
#include "proc.c"
#include "socket.c"
#include "pytasks.c"
#include "loader.c"
#include "gpu.c"
#include "ranks.c"
#include "calls.c"
#include "tls.c"
#include "profile.c"
#include "gpu_names.c"
#include "tracectx.c"
#include "propagate.c"
