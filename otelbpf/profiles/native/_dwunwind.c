/* Native unwinding of a captured user stack with elfutils libdw.
 *
 * One Process object per traced process keeps one Dwfl: its modules are
 * reported once from /proc/PID/maps (again on refresh()), and dwfl_attach_state
 * is called once with C callbacks that serve a single thread whose registers and
 * memory are the sample being unwound. Per sample, unwind() points those
 * callbacks at the new capture and calls dwfl_getthread_frames, so libdw's
 * per-module caches (ELF, CFI, symbol tables) are paid once per process, not
 * once per sample as in perf's unwind-libdw.c.
 *
 * The stack is only ever read from the copy: memory_read fails outside it.
 * Unwinding stops, with a reason, instead of letting libdw fall back to a
 * frame-pointer guess: every frame's PC is checked for CFI (cached per PC)
 * before its caller is computed.
 *
 * Frames are named lazily: a per-process dict maps (pc, activation) to the
 * Frame object the Python factory built on the first miss (bounded: cleared
 * when it reaches max_symbols).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <elfutils/libdwfl.h>
#include <dwarf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* libstdc++'s demangler (linked with -lstdc++). */
extern char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

/* Register layout of a sample, per architecture: the input holds the DWARF
 * registers 0..dwarf_nregs-1 in DWARF order; where the PC is not a DWARF
 * register of its own (aarch64) it follows them at pc_index. */
typedef struct {
    const char *name;
    unsigned dwarf_nregs;
    unsigned sp_reg;
    int pc_index; /* -1: the PC is DWARF register dwarf_nregs-1 (x86-64's RA column) */
    unsigned input_nregs;
} Arch;

#if defined(__x86_64__)
static const Arch ARCH = {"x86_64", 17, 7, -1, 17};
#elif defined(__aarch64__)
static const Arch ARCH = {"aarch64", 32, 31, 32, 33};
#else
#error "otelbpf native unwinder: unsupported architecture"
#endif

enum stop {
    STOP_NONE = 0,    /* reached the outermost frame */
    STOP_NO_CFI,      /* a PC without call frame information (hand-written assembly) */
    STOP_NO_MODULE,   /* a PC in no reported module (JIT code, a new dlopen) */
    STOP_TRUNCATED,   /* a read outside the copied stack */
    STOP_MAX_FRAMES,  /* the caller's frame limit */
    STOP_SP,          /* the stack pointer did not increase: garbage or a loop */
    STOP_ERROR,       /* libdw failed otherwise */
    STOP_COUNT
};
static const char *const STOP_NAMES[STOP_COUNT] = {
    "", "no CFI", "pc not in a module", "truncated stack copy",
    "max frames", "stack pointer did not increase", "unwind error",
};

#define MAX_FRAMES_CAP 1024
#define CFI_SLOTS 4096 /* power of two: direct-mapped per-PC CFI cache */

enum cfi { CFI_UNKNOWN = 0, CFI_YES, CFI_NO };

typedef struct {
    uint64_t pc;
    uint8_t state; /* enum cfi */
} CfiSlot;

typedef struct {
    PyObject_HEAD
    Dwfl *dwfl;
    pid_t pid;
    PyObject *factory;   /* factory(pid, pc, symbol, module, low, high, build_id) -> Frame */
    PyObject *frames;    /* dict: pc << 1 | activation -> Frame */
    Py_ssize_t max_symbols;
    unsigned long long cache_resets;
    CfiSlot *cfi;
    /* the capture being unwound */
    const uint8_t *stack;
    uint64_t stack_addr;
    uint64_t stack_len;
    uint64_t regs[64];
    int read_outside;
    /* the walk in progress */
    uint64_t pcs[MAX_FRAMES_CAP];
    uint8_t acts[MAX_FRAMES_CAP];
    int n, max;
    uint64_t last_sp;
    int stop;
} Process;

/* find_elf runs lazily inside any libdw call; the GIL serialises those, so the
 * process being served is a plain static set by each method before it calls libdw. */
static pid_t current_pid;

/* Opens a module through /proc/PID/root, so a process in another mount
 * namespace (a container) gets its own files, not the host's. */
static int find_elf(Dwfl_Module *mod, void **userdata, const char *modname,
                    Dwarf_Addr base, char **file_name, Elf **elfp)
{
    if (modname[0] == '/' && current_pid > 0) {
        char path[PATH_MAX];
        int n = snprintf(path, sizeof path, "/proc/%d/root%s", (int)current_pid, modname);
        if (n > 0 && (size_t)n < sizeof path) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                *file_name = strdup(path);
                return fd;
            }
        }
    }
    return dwfl_linux_proc_find_elf(mod, userdata, modname, base, file_name, elfp);
}

static char *debuginfo_path;
static const Dwfl_Callbacks DWFL_CALLBACKS = {
    .find_elf = find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &debuginfo_path,
};

static pid_t next_thread(Dwfl *dwfl, void *arg, void **thread_argp)
{
    (void)dwfl;
    if (*thread_argp != NULL)
        return 0;
    *thread_argp = arg;
    return ((Process *)arg)->pid;
}

static bool get_thread(Dwfl *dwfl, pid_t tid, void *arg, void **thread_argp)
{
    (void)dwfl;
    (void)tid;
    *thread_argp = arg;
    return true;
}

/* Serves 8-byte reads from the copied stack only; a miss is remembered because
 * libdw turns an unreadable return address into a normal end of stack. */
static bool memory_read(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *result, void *arg)
{
    (void)dwfl;
    Process *p = arg;
    uint64_t off = addr - p->stack_addr;
    if (addr < p->stack_addr || off > p->stack_len || p->stack_len - off < sizeof *result) {
        p->read_outside = 1;
        return false;
    }
    memcpy(result, p->stack + off, sizeof *result);
    return true;
}

static bool set_initial_registers(Dwfl_Thread *thread, void *arg)
{
    Process *p = arg;
    if (!dwfl_thread_state_registers(thread, 0, ARCH.dwarf_nregs, p->regs))
        return false;
    if (ARCH.pc_index >= 0)
        dwfl_thread_state_register_pc(thread, p->regs[ARCH.pc_index]);
    return true;
}

static const Dwfl_Thread_Callbacks THREAD_CALLBACKS = {
    .next_thread = next_thread,
    .get_thread = get_thread,
    .memory_read = memory_read,
    .set_initial_registers = set_initial_registers,
};

/* Whether libdw can compute the caller of code at PC from CFI (.eh_frame, else
 * .debug_frame); cached per PC since the lookup decodes an FDE. */
static int pc_cfi(Process *p, Dwarf_Addr pc)
{
    CfiSlot *slot = &p->cfi[(pc ^ (pc >> 12)) & (CFI_SLOTS - 1)];
    if (slot->state != CFI_UNKNOWN && slot->pc == pc)
        return slot->state;
    Dwfl_Module *mod = dwfl_addrmodule(p->dwfl, pc);
    if (mod == NULL)
        return CFI_UNKNOWN; /* not cached: a refresh may add the module */
    int state = CFI_NO;
    Dwarf_Addr bias;
    Dwarf_CFI *cfis[2] = {dwfl_module_eh_cfi(mod, &bias), NULL};
    for (int i = 0; i < 2 && state == CFI_NO; i++) {
        if (i == 1)
            cfis[1] = dwfl_module_dwarf_cfi(mod, &bias);
        Dwarf_Frame *frame;
        if (cfis[i] != NULL && dwarf_cfi_addrframe(cfis[i], pc - bias, &frame) == 0) {
            free(frame);
            state = CFI_YES;
        }
    }
    slot->pc = pc;
    slot->state = (uint8_t)state;
    return state;
}

/* Records one frame, then decides whether libdw may compute its caller. */
static int on_frame(Dwfl_Frame *state, void *arg)
{
    Process *p = arg;
    Dwarf_Addr pc;
    bool activation;
    if (!dwfl_frame_pc(state, &pc, &activation)) {
        p->stop = STOP_ERROR;
        return DWARF_CB_ABORT;
    }
    Dwarf_Word sp;
    if (dwfl_frame_reg(state, ARCH.sp_reg, &sp) == 0) {
        if (p->n > 0 && sp <= p->last_sp) {
            p->stop = STOP_SP;
            return DWARF_CB_ABORT;
        }
        p->last_sp = sp;
    }
    if (p->n >= p->max) {
        p->stop = STOP_MAX_FRAMES;
        return DWARF_CB_ABORT;
    }
    p->pcs[p->n] = pc;
    p->acts[p->n] = activation;
    p->n++;
    switch (pc_cfi(p, activation ? pc : pc - 1)) {
    case CFI_YES:
        return DWARF_CB_OK;
    case CFI_NO:
        p->stop = STOP_NO_CFI;
        return DWARF_CB_ABORT;
    default:
        p->stop = STOP_NO_MODULE;
        return DWARF_CB_ABORT;
    }
}

static void hex(char *out, const unsigned char *bits, int len)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < len; i++) {
        out[2 * i] = digits[bits[i] >> 4];
        out[2 * i + 1] = digits[bits[i] & 15];
    }
    out[2 * len] = 0;
}

/* The symbol as written in source: without its version ("@@GLIBC_2.34", which
 * libdw appends from .gnu.version) and, for C++, demangled into *owned. */
static const char *plain_name(const char *symbol, char **owned)
{
    const char *at = strchr(symbol, '@');
    if (at != NULL && at > symbol && (*owned = strndup(symbol, (size_t)(at - symbol))) != NULL)
        symbol = *owned;
    if (symbol[0] == '_' && symbol[1] == 'Z') {
        int status;
        char *demangled = __cxa_demangle(symbol, NULL, NULL, &status);
        if (demangled != NULL) {
            free(*owned);
            symbol = *owned = demangled;
        }
    }
    return symbol;
}

/* Names one frame (a cache miss): the symbol at the PC, or at PC-1 for a return
 * address, demangled, plus its module; the Python factory builds the Frame. */
static PyObject *make_frame(Process *p, uint64_t pc, int activation)
{
    Dwarf_Addr at = activation ? pc : pc - 1;
    Dwfl_Module *mod = dwfl_addrmodule(p->dwfl, at);
    const char *symbol = NULL, *modname = NULL;
    char *owned = NULL;
    Dwarf_Addr low = 0, high = 0;
    char build_id[2 * 64 + 1] = "";
    if (mod != NULL) {
        GElf_Off offset;
        GElf_Sym sym;
        symbol = dwfl_module_addrinfo(mod, at, &offset, &sym, NULL, NULL, NULL);
        if (symbol != NULL)
            symbol = plain_name(symbol, &owned);
        modname = dwfl_module_info(mod, NULL, &low, &high, NULL, NULL, NULL, NULL);
        const unsigned char *bits;
        GElf_Addr vaddr;
        int len = dwfl_module_build_id(mod, &bits, &vaddr);
        if (len > 0 && len <= 64)
            hex(build_id, bits, len);
    }
    PyObject *frame = PyObject_CallFunction(
        p->factory, "iKzzKKs", (int)p->pid, (unsigned long long)pc,
        symbol, modname,
        (unsigned long long)low, (unsigned long long)high, build_id);
    free(owned);
    return frame;
}

/* The Frame for one PC, from the cache or built and cached. */
static PyObject *frame_for(Process *p, uint64_t pc, int activation)
{
    if (pc >> 62)
        return make_frame(p, pc, activation); /* no user-space PC: not worth a key */
    PyObject *key = PyLong_FromUnsignedLongLong(pc << 1 | (uint64_t)activation);
    if (key == NULL)
        return NULL;
    PyObject *frame = PyDict_GetItemWithError(p->frames, key);
    if (frame != NULL) {
        Py_DECREF(key);
        Py_INCREF(frame);
        return frame;
    }
    if (PyErr_Occurred() || (frame = make_frame(p, pc, activation)) == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    if (PyDict_GET_SIZE(p->frames) >= p->max_symbols) {
        PyDict_Clear(p->frames);
        p->cache_resets++;
    }
    int rc = PyDict_SetItem(p->frames, key, frame);
    Py_DECREF(key);
    if (rc < 0) {
        Py_DECREF(frame);
        return NULL;
    }
    return frame;
}

/* Reports the process's mappings (again): modules no longer mapped go, new
 * ones come, and every per-PC cache is dropped since addresses may be reused. */
static int report(Process *p)
{
    current_pid = p->pid;
    dwfl_report_begin(p->dwfl);
    int rc = dwfl_linux_proc_report(p->dwfl, p->pid);
    dwfl_report_end(p->dwfl, NULL, NULL);
    memset(p->cfi, 0, CFI_SLOTS * sizeof *p->cfi);
    PyDict_Clear(p->frames);
    if (rc > 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (rc < 0) {
        PyErr_Format(PyExc_OSError, "libdw: %s", dwfl_errmsg(-1));
        return -1;
    }
    return 0;
}

static void Process_dealloc(Process *p)
{
    if (p->dwfl != NULL)
        dwfl_end(p->dwfl);
    PyMem_Free(p->cfi);
    Py_XDECREF(p->factory);
    Py_XDECREF(p->frames);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *Process_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"pid", "factory", "max_symbols", NULL};
    int pid;
    PyObject *factory;
    Py_ssize_t max_symbols = 65536;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO|n", kwlist, &pid, &factory, &max_symbols))
        return NULL;
    Process *p = (Process *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    p->pid = pid;
    p->max_symbols = max_symbols > 0 ? max_symbols : 1;
    Py_INCREF(factory);
    p->factory = factory;
    p->frames = PyDict_New();
    p->cfi = PyMem_Calloc(CFI_SLOTS, sizeof *p->cfi);
    p->dwfl = dwfl_begin(&DWFL_CALLBACKS);
    if (p->frames == NULL || p->cfi == NULL || p->dwfl == NULL) {
        Py_DECREF(p);
        return PyErr_NoMemory();
    }
    if (report(p) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    if (!dwfl_attach_state(p->dwfl, NULL, pid, &THREAD_CALLBACKS, p)) {
        PyErr_Format(PyExc_OSError, "dwfl_attach_state(%d): %s", pid, dwfl_errmsg(-1));
        Py_DECREF(p);
        return NULL;
    }
    return (PyObject *)p;
}

static int load_regs(Process *p, PyObject *regs)
{
    PyObject *seq = PySequence_Fast(regs, "regs must be a sequence of ints");
    if (seq == NULL)
        return -1;
    if ((size_t)PySequence_Fast_GET_SIZE(seq) < ARCH.input_nregs) {
        PyErr_Format(PyExc_ValueError, "%s needs %u registers", ARCH.name, ARCH.input_nregs);
        Py_DECREF(seq);
        return -1;
    }
    for (unsigned i = 0; i < ARCH.input_nregs; i++) {
        p->regs[i] = PyLong_AsUnsignedLongLongMask(PySequence_Fast_GET_ITEM(seq, i));
        if (p->regs[i] == (uint64_t)-1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* Why a walk ended, from the callback's verdict, libdw's result and the reads. */
static int stop_reason(Process *p, int rc)
{
    if (p->stop != STOP_NONE)
        return p->stop;
    if (p->read_outside)
        return STOP_TRUNCATED;
    return rc == 0 ? STOP_NONE : STOP_ERROR;
}

static PyObject *frames_tuple(Process *p)
{
    PyObject *frames = PyTuple_New(p->n);
    if (frames == NULL)
        return NULL;
    for (int i = 0; i < p->n; i++) {
        PyObject *frame = frame_for(p, p->pcs[i], p->acts[i]);
        if (frame == NULL) {
            Py_DECREF(frames);
            return NULL;
        }
        PyTuple_SET_ITEM(frames, i, frame);
    }
    return frames;
}

PyDoc_STRVAR(unwind_doc,
"unwind(regs, stack_addr, stack, max_frames) -> (frames, stop)\n\n"
"Unwinds one sample: regs in DWARF order, stack the bytes copied from stack_addr.\n"
"frames: Frame objects, leaf first; stop: an index into REASONS (0: complete).");

static PyObject *Process_unwind(Process *p, PyObject *args)
{
    PyObject *regs;
    unsigned long long stack_addr;
    Py_buffer stack;
    int max_frames = 127;
    if (!PyArg_ParseTuple(args, "OKy*|i", &regs, &stack_addr, &stack, &max_frames))
        return NULL;
    if (load_regs(p, regs) < 0) {
        PyBuffer_Release(&stack);
        return NULL;
    }
    current_pid = p->pid;
    p->stack = stack.buf;
    p->stack_addr = stack_addr;
    p->stack_len = (uint64_t)stack.len;
    p->read_outside = 0;
    p->n = 0;
    p->max = max_frames < 1 ? 1 : max_frames > MAX_FRAMES_CAP ? MAX_FRAMES_CAP : max_frames;
    p->stop = STOP_NONE;
    int rc = dwfl_getthread_frames(p->dwfl, p->pid, on_frame, p);
    int stop = stop_reason(p, rc);
    p->stack = NULL;
    PyBuffer_Release(&stack);
    PyObject *frames = frames_tuple(p);
    if (frames == NULL)
        return NULL;
    return Py_BuildValue("(Ni)", frames, stop);
}

static PyObject *Process_refresh(Process *p, PyObject *unused)
{
    (void)unused;
    if (report(p) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Process_get_cache_resets(Process *p, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(p->cache_resets);
}

static PyObject *Process_get_cached_frames(Process *p, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(PyDict_GET_SIZE(p->frames));
}

static PyMethodDef Process_methods[] = {
    {"unwind", (PyCFunction)Process_unwind, METH_VARARGS, unwind_doc},
    {"refresh", (PyCFunction)Process_refresh, METH_NOARGS,
     "Re-reads /proc/PID/maps (a library was dlopen'ed) and drops the per-PC caches."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Process_getset[] = {
    {"cache_resets", (getter)Process_get_cache_resets, NULL, "times the frame cache was full and cleared", NULL},
    {"cached_frames", (getter)Process_get_cached_frames, NULL, "frames in the cache now", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ProcessType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otelbpf.profiles.native._dwunwind.Process",
    .tp_doc = PyDoc_STR("Process(pid, factory, max_symbols=65536): one process's Dwfl and caches."),
    .tp_basicsize = sizeof(Process),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Process_new,
    .tp_dealloc = (destructor)Process_dealloc,
    .tp_methods = Process_methods,
    .tp_getset = Process_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dwunwind",
    "Unwinds captured user stacks with libdw (see otelbpf.profiles.native.unwinder).", -1, NULL,
};

PyMODINIT_FUNC PyInit__dwunwind(void)
{
    if (PyType_Ready(&ProcessType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *reasons = PyTuple_New(STOP_COUNT);
    if (reasons == NULL)
        goto fail;
    for (int i = 0; i < STOP_COUNT; i++)
        PyTuple_SET_ITEM(reasons, i, PyUnicode_FromString(STOP_NAMES[i]));
    Py_INCREF(&ProcessType);
    if (PyModule_AddObject(m, "Process", (PyObject *)&ProcessType) < 0
        || PyModule_AddObject(m, "REASONS", reasons) < 0
        || PyModule_AddStringConstant(m, "ARCH", ARCH.name) < 0
        || PyModule_AddIntConstant(m, "NREGS", ARCH.input_nregs) < 0
        || PyModule_AddIntConstant(m, "MAX_FRAMES", MAX_FRAMES_CAP) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
