/* Native unwinding of a captured user stack with elfutils libdw.
 *
 * One Process object per traced process keeps one Dwfl: its modules are
 * reported once from /proc/PID/maps (again on refresh()), and dwfl_attach_state
 * is called once with C callbacks that serve a single thread whose registers and
 * memory are the sample being unwound, so libdw's per-module caches (ELF, CFI,
 * symbol tables) are paid once per process, not once per sample as in perf's
 * unwind-libdw.c.
 *
 * Per sample, the walk first runs on a per-PC rule cache (x86-64): the first
 * time a PC is seen, libdw decodes its FDE (dwarf_cfi_addrframe) and the result
 * is compiled into a compact rule (the CFA as register + offset, and per
 * register: undefined, same value, saved at CFA+N, CFA+N, another register);
 * the walk then computes each caller exactly as libdwfl's frame_unwind.c does,
 * without libdw. A PC whose CFI needs a DWARF expression (PLT stubs, signal
 * trampolines, stack realignment) or marks a signal frame sends the whole sample
 * to libdw's own walk (dwfl_getthread_frames), which stays the reference: both
 * give the same frames (tests/test_profiles_native.py compares them on live
 * samples and fuzzed ones).
 *
 * The stack is only ever read from the copy: reads outside it fail. Unwinding
 * stops, with a reason, instead of letting libdw fall back to a frame-pointer
 * guess: every frame's PC is checked for CFI (the rule cache) before its caller
 * is computed.
 *
 * Frames are named lazily: a per-process dict maps (pc, activation) to the
 * Frame object the Python factory built on the first miss (bounded: cleared
 * when it reaches max_symbols), with a direct-mapped array in front of it. The
 * tuple of a walk is interned (a direct-mapped cache of recent walks), so the
 * same native stack is the same tuple object, and ends in the marker frame of
 * its stop reason when the caller gave markers.
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
#define RULE_SLOTS 8192   /* power of two: direct-mapped per-PC rule cache */
#define FRAME_SLOTS 4096  /* power of two: direct-mapped (pc, activation) -> Frame, before the dict */
#define STACK_SLOTS 512   /* power of two: direct-mapped recent walks -> their interned tuple */
#define STACK_MAX_INTERN 128 /* longer walks are not interned */

#if defined(__x86_64__)
#define FAST_UNWIND 1
#define NREGS_CFI 17     /* ebl_frame_nregs for x86-64: the registers libdwfl unwinds */
#define RA_REG 16        /* the CIE's return address column (rip) */
#else
#define FAST_UNWIND 0
#define NREGS_CFI 1
#define RA_REG 0
#endif

/* What the CFI says of a lookup address. */
enum rule_state {
    RULE_EMPTY = 0,  /* not looked up (an empty slot) */
    RULE_SIMPLE,     /* compiled: the fast walk can compute the caller */
    RULE_COMPLEX,    /* CFI needs libdw (an expression, a signal frame, an odd RA column) */
    RULE_NO_CFI,     /* in a module, but no FDE covers it */
};

/* How one register of the caller is recovered (libdw's dwarf_frame_register rules). */
enum reg_rule {
    REG_UNDEFINED = 0, /* call-clobbered: cannot be recovered */
    REG_ERROR,         /* libdw could not give a rule: left unset, like undefined but not "the end" */
    REG_SAME,          /* unchanged from this frame */
    REG_OFFSET,        /* saved at CFA + val */
    REG_VAL_OFFSET,    /* is CFA + val */
    REG_REGISTER,      /* is this frame's register val */
    REG_EXPRESSION,    /* a DWARF expression: libdw's business (RULE_COMPLEX) */
};

/* One cache line: offsets from the CFA are kept in units of 8 bytes (x86-64's
 * CIEs factor them by -8), a rule with any other offset is left to libdw. */
typedef struct {
    uint64_t pc;       /* the lookup address (a return address minus one) */
    int32_t cfa_off;
    uint8_t state;     /* enum rule_state */
    uint8_t cfa_reg;   /* 0xff: no CFA */
    uint8_t kind[NREGS_CFI];
    int8_t val[NREGS_CFI]; /* REG_OFFSET, REG_VAL_OFFSET: the offset / 8; REG_REGISTER: the register */
} __attribute__((aligned(64))) Rule;
_Static_assert(sizeof(Rule) == 64, "a rule is one cache line");

typedef struct {
    uint64_t key;      /* pc << 1 | activation; 0: empty */
    PyObject *frame;
} FrameSlot;

typedef struct {
    uint64_t hash;
    int n, stop;
    uint64_t *keys;    /* n keys (pc << 1 | activation), owned */
    PyObject *tuple;
} StackSlot;

/* The sized symbols of one module, sorted by start (to tell whether a symbol's
 * range holds any other symbol). */
typedef struct {
    uint64_t start, end;
    int ndx; /* in the module's symbol table (dwfl_module_getsym_info) */
} Span;

typedef struct {
    Dwfl_Module *mod;
    Span *spans;
    uint64_t *max_end; /* max_end[i]: the largest end of spans[0..i] */
    size_t n;
    uint64_t *starts;  /* every symbol's address, sized or not, sorted */
    size_t n_starts;
    uint64_t *labels;  /* the addresses of the symbols without a size, sorted */
    size_t n_labels;
} SymIndex;

/* A range whose every address libdw names the same (see symbol_at). */
typedef struct {
    uint64_t start, end;
    Dwfl_Module *mod;
    char *name; /* as libdw gave it; NULL: no symbol */
} FuncRange;

#define MAX_FUNC_RANGES 65536

typedef struct {
    PyObject_HEAD
    Dwfl *dwfl;
    pid_t pid;
    PyObject *factory;   /* factory(pid, pc, symbol, module, low, high, build_id) -> Frame */
    PyObject *frames;    /* dict: pc << 1 | activation -> Frame */
    PyObject *markers;   /* None, or a tuple indexed by stop reason: the frame a stopped walk ends in */
    Py_ssize_t max_symbols;
    unsigned long long cache_resets;
    Rule *rules;
    FrameSlot *frame_slots;
    StackSlot *stack_slots;
    int fast;            /* use the rule cache and the symbol ranges (else libdw alone) */
    /* symbol look-ups (make_frame) */
    SymIndex *sym_indexes;
    size_t n_sym_indexes;
    FuncRange *funcs;    /* sorted by start, disjoint */
    size_t n_funcs, cap_funcs;
    unsigned long long symbol_lookups, symbol_range_hits, symbol_index_hits;
    /* counters */
    unsigned long long fast_walks, libdw_walks, rule_misses;
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
    uint64_t last_lookup; /* the lookup address of the last frame recorded */
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

/* -- the per-PC rule cache ------------------------------------------------- */

static inline Rule *rule_slot(Process *p, uint64_t pc)
{
    return &p->rules[(pc ^ (pc >> 13)) & (RULE_SLOTS - 1)];
}

static int fits32(int64_t v)
{
    return v >= INT32_MIN && v <= INT32_MAX;
}

/* Whether a CFA offset fits a rule (see Rule). */
static int fits_scaled(int64_t v)
{
    return v % 8 == 0 && v / 8 >= INT8_MIN && v / 8 <= INT8_MAX;
}

/* Compiles libdw's decoded frame state into *r (RULE_SIMPLE), or says why not. */
static void compile_rule(Rule *r, Dwarf_Frame *frame)
{
    r->state = RULE_COMPLEX;
    r->cfa_reg = 0xff;
    r->cfa_off = 0;
    for (int i = 0; i < NREGS_CFI; i++) {
        r->kind[i] = REG_EXPRESSION;
        r->val[i] = 0;
    }
#if FAST_UNWIND
    bool signal = false;
    int ra = dwarf_frame_info(frame, NULL, NULL, &signal);
    int simple = ra == RA_REG && !signal;
    Dwarf_Op *ops;
    size_t nops;
    if (dwarf_frame_cfa(frame, &ops, &nops) != 0) {
        simple = 0;
    } else if (nops == 1 && ops[0].atom == DW_OP_bregx && ops[0].number < NREGS_CFI
               && fits32((int64_t)ops[0].number2)) {
        r->cfa_reg = (uint8_t)ops[0].number;
        r->cfa_off = (int32_t)(int64_t)ops[0].number2;
    } else if (nops == 1 && ops[0].atom >= DW_OP_breg0 && ops[0].atom <= DW_OP_breg31
               && ops[0].atom - DW_OP_breg0 < NREGS_CFI && fits32((int64_t)ops[0].number)) {
        r->cfa_reg = (uint8_t)(ops[0].atom - DW_OP_breg0);
        r->cfa_off = (int32_t)(int64_t)ops[0].number;
    } else if (nops != 0) {
        simple = 0; /* an expression (0 ops: no CFA, every CFA-based rule fails) */
    }
    for (int reg = 0; reg < NREGS_CFI; reg++) {
        Dwarf_Op mem[3];
        uint8_t kind = REG_EXPRESSION;
        int64_t val = 0;
        if (dwarf_frame_register(frame, reg, mem, &ops, &nops) != 0) {
            kind = REG_ERROR;
        } else if (nops == 0) {
            kind = ops == mem ? REG_UNDEFINED : ops == NULL ? REG_SAME : REG_ERROR;
        } else if (ops[0].atom == DW_OP_call_frame_cfa) {
            size_t i = 1;
            if (i < nops && ops[i].atom == DW_OP_plus_uconst)
                val = (int64_t)ops[i++].number;
            int value = i < nops && ops[i].atom == DW_OP_stack_value;
            if (value)
                i++;
            if (i == nops && fits_scaled(val)) {
                kind = value ? REG_VAL_OFFSET : REG_OFFSET;
                val /= 8;
            }
        } else if (nops == 1 && ops[0].atom == DW_OP_regx && ops[0].number < 128) {
            kind = REG_REGISTER;
            val = (int64_t)ops[0].number;
        }
        if (kind == REG_EXPRESSION)
            simple = 0;
        r->kind[reg] = kind;
        r->val[reg] = (int8_t)val;
    }
    if (simple)
        r->state = RULE_SIMPLE;
#else
    (void)frame;
#endif
}

/* The rule for a lookup address (a PC, or a return address minus one), cached
 * per address; NULL when the address is in no reported module (not cached: a
 * refresh may add the module). CFI is looked up as libdwfl does: .eh_frame
 * first, else .debug_frame. */
static Rule *lookup_rule(Process *p, uint64_t pc)
{
    Rule *slot = rule_slot(p, pc);
    if (slot->state != RULE_EMPTY && slot->pc == pc)
        return slot;
    p->rule_misses++;
    Dwfl_Module *mod = dwfl_addrmodule(p->dwfl, pc);
    if (mod == NULL)
        return NULL;
    Rule rule;
    memset(&rule, 0, sizeof rule);
    rule.state = RULE_NO_CFI;
    Dwarf_Addr bias;
    for (int i = 0; i < 2 && rule.state == RULE_NO_CFI; i++) {
        Dwarf_CFI *cfi = i == 0 ? dwfl_module_eh_cfi(mod, &bias) : dwfl_module_dwarf_cfi(mod, &bias);
        Dwarf_Frame *frame;
        if (cfi != NULL && dwarf_cfi_addrframe(cfi, pc - bias, &frame) == 0) {
            compile_rule(&rule, frame);
            free(frame);
        }
    }
    rule.pc = pc;
    *slot = rule;
    return slot;
}

/* -- what both walks do at each frame ---------------------------------------- */

/* Before a frame is recorded: the stack pointer must grow from frame to frame
 * (when it is known) and the walk is bounded. STOP_NONE: go on. */
static int frame_allowed(Process *p, int sp_known, uint64_t sp)
{
    if (sp_known) {
        if (p->n > 0 && sp <= p->last_sp)
            return STOP_SP;
        p->last_sp = sp;
    }
    return p->n >= p->max ? STOP_MAX_FRAMES : STOP_NONE;
}

/* Records the frame at pc, whose rule was looked up at lookup (pc, or pc - 1 for a
 * return address); the stop reason when no caller can be computed from that rule
 * (STOP_NONE: go on). One place, so that both walks record and stop alike. */
static int record_frame(Process *p, uint64_t pc, int activation, uint64_t lookup, const Rule *rule)
{
    p->pcs[p->n] = pc;
    p->acts[p->n] = (uint8_t)activation;
    p->n++;
    p->last_lookup = lookup;
    if (rule == NULL)
        return STOP_NO_MODULE;
    return rule->state == RULE_NO_CFI ? STOP_NO_CFI : STOP_NONE;
}

/* -- libdw's walk ------------------------------------------------------------- */

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
    int sp_known = dwfl_frame_reg(state, ARCH.sp_reg, &sp) == 0;
    p->stop = frame_allowed(p, sp_known, sp_known ? sp : 0);
    if (p->stop != STOP_NONE)
        return DWARF_CB_ABORT;
    Dwarf_Addr lookup = activation ? pc : pc - 1;
    p->stop = record_frame(p, pc, activation, lookup, lookup_rule(p, lookup));
    return p->stop == STOP_NONE ? DWARF_CB_OK : DWARF_CB_ABORT;
}

/* Why a walk ended, from the callback's verdict, libdw's result and the reads.
 * A walk that ended because the last frame's CFI says its return address is
 * undefined (_start, a thread's entry) reached the outermost frame: complete,
 * even when a read of some other register fell outside the copy on the way. */
static int stop_reason(Process *p, int rc)
{
    if (p->stop != STOP_NONE)
        return p->stop;
    if (rc == 0 && p->n > 0) {
        Rule *rule = rule_slot(p, p->last_lookup);
        if (rule->state != RULE_EMPTY && rule->pc == p->last_lookup && rule->kind[RA_REG] == REG_UNDEFINED
            && FAST_UNWIND)
            return STOP_NONE;
    }
    if (p->read_outside)
        return STOP_TRUNCATED;
    return rc == 0 ? STOP_NONE : STOP_ERROR;
}

/* -- the fast walk (x86-64) ---------------------------------------------------- */

static inline int read_word(Process *p, uint64_t addr, uint64_t *out)
{
    uint64_t off = addr - p->stack_addr;
    if (addr < p->stack_addr || off > p->stack_len || p->stack_len - off < 8) {
        p->read_outside = 1;
        return 0;
    }
    memcpy(out, p->stack + off, 8);
    return 1;
}

enum { FAST_DONE = 0, FAST_LIBDW = 1 };

/* Walks the sample with the rule cache; FAST_LIBDW when a frame needs libdw
 * (the caller then redoes the whole sample with libdw: nothing of this walk is
 * kept). Mirrors dwfl_getthread_frames + on_frame + frame_unwind.c's
 * handle_cfi for rules without expressions or signal frames. */
static int fast_walk(Process *p)
{
#if FAST_UNWIND
    uint64_t regs[NREGS_CFI], next[NREGS_CFI];
    uint32_t set = (1u << NREGS_CFI) - 1, next_set;
    memcpy(regs, p->regs, sizeof regs);
    uint64_t pc = regs[RA_REG];
    for (int k = 0;; k++) {
        int activation = k == 0;
        p->stop = frame_allowed(p, set >> ARCH.sp_reg & 1, regs[ARCH.sp_reg]);
        if (p->stop != STOP_NONE)
            return FAST_DONE;
        uint64_t lookup = activation ? pc : pc - 1;
        Rule *rule = lookup_rule(p, lookup);
        if (rule != NULL && rule->state == RULE_COMPLEX)
            return FAST_LIBDW;
        p->stop = record_frame(p, pc, activation, lookup, rule);
        if (p->stop != STOP_NONE)
            return FAST_DONE;
        /* the caller's registers (frame_unwind.c: handle_cfi) */
        int cfa_ok = rule->cfa_reg < NREGS_CFI && (set >> rule->cfa_reg & 1);
        uint64_t cfa = cfa_ok ? regs[rule->cfa_reg] + (uint64_t)(int64_t)rule->cfa_off : 0;
        next_set = 0;
        for (int r = 0; r < NREGS_CFI; r++) {
            uint64_t v;
            int64_t val = rule->val[r];
            uint64_t off = (uint64_t)(val * 8);
            switch (rule->kind[r]) {
            case REG_SAME:
                if (set >> r & 1) {
                    next[r] = regs[r];
                    next_set |= 1u << r;
                }
                break;
            case REG_OFFSET:
                if (cfa_ok && read_word(p, cfa + off, &v)) {
                    next[r] = v;
                    next_set |= 1u << r;
                }
                break;
            case REG_VAL_OFFSET:
                if (cfa_ok) {
                    next[r] = cfa + off;
                    next_set |= 1u << r;
                }
                break;
            case REG_REGISTER:
                if (val >= 0 && val < NREGS_CFI && (set >> val & 1)) {
                    next[r] = regs[val];
                    next_set |= 1u << r;
                }
                break;
            default: /* undefined, or no rule: left unset */
                break;
            }
        }
        /* the caller's PC: undefined return address, none computed, or 0 end the stack */
        if (rule->kind[RA_REG] == REG_UNDEFINED || !(next_set >> RA_REG & 1) || next[RA_REG] == 0)
            return FAST_DONE;
        pc = next[RA_REG];
        memcpy(regs, next, sizeof regs);
        set = next_set;
    }
#else
    (void)p;
    return FAST_LIBDW;
#endif
}

/* Why the fast walk ended: as stop_reason for libdw's (rc 0: it ended normally). */
static int fast_stop_reason(Process *p)
{
    return stop_reason(p, 0);
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

/* -- symbol look-ups -------------------------------------------------------------
 *
 * dwfl_module_addrinfo scans the module's whole symbol table on every call
 * (tens of microseconds for a static python3 or libtorch). Its answer for one
 * address holds for every address of that symbol's range when no other sized
 * symbol overlaps the range (aliases of exactly the same range aside): the
 * candidates libdw weighs are then the same set for each of them. Such ranges
 * are remembered (FuncRange), so a new PC in a function already named costs a
 * binary search. Whether a range is alone is read from a sorted index of the
 * module's sized symbols, built on its first look-up. */

static int span_cmp(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void free_index(SymIndex *index)
{
    PyMem_Free(index->spans);
    PyMem_Free(index->max_end);
    PyMem_Free(index->starts);
    PyMem_Free(index->labels);
    index->spans = NULL;
    index->max_end = index->starts = index->labels = NULL;
    index->n = index->n_starts = index->n_labels = 0;
}

/* The module's symbol index, built on first use; NULL without memory. An
 * index without spans (no symbol table, no memory) answers nothing. */
static SymIndex *sym_index(Process *p, Dwfl_Module *mod)
{
    for (size_t i = 0; i < p->n_sym_indexes; i++)
        if (p->sym_indexes[i].mod == mod)
            return &p->sym_indexes[i];
    SymIndex *grown = PyMem_Realloc(p->sym_indexes, (p->n_sym_indexes + 1) * sizeof *grown);
    if (grown == NULL)
        return NULL;
    p->sym_indexes = grown;
    SymIndex *index = &p->sym_indexes[p->n_sym_indexes++];
    memset(index, 0, sizeof *index);
    index->mod = mod;
    int count = dwfl_module_getsymtab(mod);
    if (count <= 1)
        return index;
    index->spans = PyMem_Malloc((size_t)count * sizeof *index->spans);
    index->max_end = PyMem_Malloc((size_t)count * sizeof *index->max_end);
    index->starts = PyMem_Malloc((size_t)count * sizeof *index->starts);
    index->labels = PyMem_Malloc((size_t)count * sizeof *index->labels);
    if (index->spans == NULL || index->max_end == NULL || index->starts == NULL || index->labels == NULL) {
        free_index(index);
        return index;
    }
    for (int i = 1; i < count; i++) {
        GElf_Sym sym;
        GElf_Addr addr;
        GElf_Word shndx;
        if (dwfl_module_getsym_info(mod, i, &sym, &addr, &shndx, NULL, NULL) == NULL)
            continue;
        index->starts[index->n_starts++] = addr;
        if (sym.st_size > 0)
            index->spans[index->n++] = (Span){addr, addr + sym.st_size, i};
        else
            index->labels[index->n_labels++] = addr;
    }
    qsort(index->labels, index->n_labels, sizeof *index->labels, u64_cmp);
    uint64_t *fewer = PyMem_Realloc(index->labels, (index->n_labels ? index->n_labels : 1) * sizeof *fewer);
    if (fewer != NULL) /* symbols without a size are few */
        index->labels = fewer;
    qsort(index->spans, index->n, sizeof *index->spans, span_cmp);
    qsort(index->starts, index->n_starts, sizeof *index->starts, u64_cmp);
    uint64_t top = 0;
    for (size_t i = 0; i < index->n; i++) {
        if (index->spans[i].end > top)
            top = index->spans[i].end;
        index->max_end[i] = top;
    }
    return index;
}

/* How many of the sorted values are at or below x. */
static size_t count_at_most(const uint64_t *values, size_t n, uint64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (values[mid] <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first span of index starting at or after start. */
static size_t first_span_from(const SymIndex *index, uint64_t start)
{
    size_t lo = 0, hi = index->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (index->spans[mid].start < start)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Whether [start, end) of mod overlaps no sized symbol but its own aliases:
 * then libdw weighs the same sized candidates for every address in it, and a
 * sized candidate always wins over labels without a size. */
static int range_alone(Process *p, Dwfl_Module *mod, uint64_t start, uint64_t end)
{
    SymIndex *index = sym_index(p, mod);
    if (index == NULL || index->spans == NULL)
        return 0;
    size_t lo = first_span_from(index, start);
    if (lo > 0 && index->max_end[lo - 1] > start)
        return 0;
    int found = 0;
    for (size_t j = lo; j < index->n && index->spans[j].start < end; j++) {
        if (index->spans[j].start != start || index->spans[j].end != end)
            return 0;
        found = 1;
    }
    return found;
}

/* Where the answer "no symbol" for addr holds too: the addresses after the last
 * symbol starting below addr, up to the next symbol, within addr's section, and
 * not covered by any sized symbol. For each of them libdw weighs the same
 * symbols (those starting at or below it), none starting exactly there, in the
 * same section: the same answer. Nothing when a symbol starts at addr or a sized
 * one covers it (*lo == *hi). *known: the answer is "no symbol" without asking
 * libdw, for no symbol without a size (a label, which libdw may fall back to)
 * lies in the section at or below addr either. */
static void no_symbol_range(Process *p, Dwfl_Module *mod, uint64_t addr, uint64_t *lo, uint64_t *hi, int *known)
{
    *lo = *hi = addr;
    *known = 0;
    SymIndex *index = sym_index(p, mod);
    if (index == NULL || index->spans == NULL)
        return;
    size_t after = first_span_from(index, addr + 1);
    uint64_t covered = after > 0 ? index->max_end[after - 1] : 0; /* sized symbols end below this */
    if (covered > addr)
        return;
    size_t a = count_at_most(index->starts, index->n_starts, addr); /* starts[a]: the first after addr */
    if (a > 0 && index->starts[a - 1] == addr)
        return;
    uint64_t low = a > 0 ? index->starts[a - 1] + 1 : 0;
    uint64_t high = a < index->n_starts ? index->starts[a] : UINT64_MAX;
    if (covered > low)
        low = covered;
    Dwarf_Addr relative = addr, bias;
    Elf_Scn *scn = dwfl_module_address_section(mod, &relative, &bias);
    GElf_Shdr shdr;
    if (scn == NULL || gelf_getshdr(scn, &shdr) == NULL || relative > shdr.sh_size || relative > addr)
        return;
    uint64_t section = addr - relative;
    if (section > low)
        low = section;
    if (section + shdr.sh_size < high)
        high = section + shdr.sh_size;
    if (low <= addr && addr < high) {
        *lo = low;
        *hi = high;
        size_t labels = count_at_most(index->labels, index->n_labels, addr);
        *known = labels == 0 || index->labels[labels - 1] < section;
    }
}

/* libdw's answer for addr read from the index, where it cannot differ: one
 * sized symbol covers addr (no alias, no overlap), it is one libdw weighs (a
 * name, defined, not a section, file or TLS symbol) and no other symbol starts
 * exactly at addr (libdw's search of the global symbols first would stop at
 * such a label). NULL: ask libdw. */
static const char *index_symbol(Process *p, Dwfl_Module *mod, uint64_t addr)
{
    SymIndex *index = sym_index(p, mod);
    if (index == NULL || index->spans == NULL)
        return NULL;
    size_t after = first_span_from(index, addr + 1); /* spans[0..after) start at or below addr */
    const Span *found = NULL;
    for (size_t j = after; j-- > 0 && index->max_end[j] > addr;) {
        if (index->spans[j].end > addr) {
            if (found != NULL)
                return NULL;
            found = &index->spans[j];
        }
    }
    if (found == NULL)
        return NULL;
    size_t at_addr = count_at_most(index->starts, index->n_starts, addr)
                     - (addr ? count_at_most(index->starts, index->n_starts, addr - 1) : 0);
    if (at_addr != (found->start == addr))
        return NULL;
    GElf_Sym sym;
    GElf_Addr value;
    GElf_Word shndx;
    const char *name = dwfl_module_getsym_info(mod, found->ndx, &sym, &value, &shndx, NULL, NULL);
    if (name == NULL || name[0] == '\0' || value != found->start || sym.st_shndx == SHN_UNDEF)
        return NULL;
    switch (GELF_ST_TYPE(sym.st_info)) {
    case STT_NOTYPE:
    case STT_OBJECT:
    case STT_FUNC:
    case STT_GNU_IFUNC:
        return name;
    default:
        return NULL;
    }
}

/* The remembered range holding addr, or NULL. */
static FuncRange *func_at(Process *p, uint64_t addr)
{
    size_t lo = 0, hi = p->n_funcs; /* the first range starting after addr */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->funcs[mid].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || addr >= p->funcs[lo - 1].end)
        return NULL;
    return &p->funcs[lo - 1];
}

static void clear_symbols(Process *p)
{
    for (size_t i = 0; i < p->n_funcs; i++)
        free(p->funcs[i].name);
    PyMem_Free(p->funcs);
    p->funcs = NULL;
    p->n_funcs = p->cap_funcs = 0;
    for (size_t i = 0; i < p->n_sym_indexes; i++)
        free_index(&p->sym_indexes[i]);
    PyMem_Free(p->sym_indexes);
    p->sym_indexes = NULL;
    p->n_sym_indexes = 0;
}

/* Remembers [start, end) of mod as named name (NULL: no symbol). Ranges stay
 * disjoint: one overlapping a remembered one is not kept. */
static void remember_range(Process *p, Dwfl_Module *mod, uint64_t start, uint64_t end, const char *name)
{
    if (start >= end)
        return;
    if (p->n_funcs >= MAX_FUNC_RANGES) {
        for (size_t i = 0; i < p->n_funcs; i++)
            free(p->funcs[i].name);
        p->n_funcs = 0;
    }
    size_t lo = 0, hi = p->n_funcs; /* the first range starting at or after start */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->funcs[mid].start < start)
            lo = mid + 1;
        else
            hi = mid;
    }
    if ((lo < p->n_funcs && p->funcs[lo].start < end) || (lo > 0 && p->funcs[lo - 1].end > start))
        return;
    if (p->n_funcs == p->cap_funcs) {
        size_t cap = p->cap_funcs ? 2 * p->cap_funcs : 64;
        FuncRange *grown = PyMem_Realloc(p->funcs, cap * sizeof *grown);
        if (grown == NULL)
            return;
        p->funcs = grown;
        p->cap_funcs = cap;
    }
    char *copy = NULL;
    if (name != NULL && (copy = strdup(name)) == NULL)
        return;
    memmove(&p->funcs[lo + 1], &p->funcs[lo], (p->n_funcs - lo) * sizeof *p->funcs);
    p->funcs[lo] = (FuncRange){start, end, mod, copy};
    p->n_funcs++;
}

/* The symbol libdw names addr of mod by (dwfl_module_addrinfo), or NULL,
 * through the remembered ranges. */
static const char *symbol_at(Process *p, Dwfl_Module *mod, uint64_t addr)
{
    FuncRange *func = p->fast ? func_at(p, addr) : NULL;
    if (func != NULL && func->mod == mod) {
        p->symbol_range_hits++;
        return func->name;
    }
    const char *known = p->fast ? index_symbol(p, mod, addr) : NULL;
    if (known != NULL) {
        p->symbol_index_hits++;
        return known;
    }
    uint64_t lo = 0, hi = 0;
    int none;
    if (p->fast) {
        no_symbol_range(p, mod, addr, &lo, &hi, &none);
        if (none) {
            p->symbol_index_hits++;
            remember_range(p, mod, lo, hi, NULL);
            return NULL;
        }
    }
    p->symbol_lookups++;
    GElf_Off offset;
    GElf_Sym sym;
    const char *symbol = dwfl_module_addrinfo(mod, addr, &offset, &sym, NULL, NULL, NULL);
    if (symbol != NULL && sym.st_size > 0 && offset < sym.st_size) {
        uint64_t start = addr - offset;
        if (range_alone(p, mod, start, start + sym.st_size))
            remember_range(p, mod, start, start + sym.st_size, symbol);
    } else if (symbol == NULL && p->fast) {
        remember_range(p, mod, lo, hi, NULL);
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
        symbol = symbol_at(p, mod, at);
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

/* Drops every cached Frame and interned walk (the dict is full, or the
 * mappings changed). */
static void clear_frames(Process *p)
{
    for (int i = 0; i < FRAME_SLOTS; i++) {
        p->frame_slots[i].key = 0;
        Py_CLEAR(p->frame_slots[i].frame);
    }
    for (int i = 0; i < STACK_SLOTS; i++) {
        StackSlot *slot = &p->stack_slots[i];
        PyMem_Free(slot->keys);
        slot->keys = NULL;
        slot->n = 0;
        Py_CLEAR(slot->tuple);
    }
    PyDict_Clear(p->frames);
}

/* The Frame for one PC, from the caches or built and cached. */
static PyObject *frame_for(Process *p, uint64_t pc, int activation)
{
    if (pc >> 62)
        return make_frame(p, pc, activation); /* no user-space PC: not worth a key */
    uint64_t code = pc << 1 | (uint64_t)activation;
    FrameSlot *slot = &p->frame_slots[(code ^ (code >> 13)) & (FRAME_SLOTS - 1)];
    if (slot->key == code && slot->frame != NULL) {
        Py_INCREF(slot->frame);
        return slot->frame;
    }
    PyObject *key = PyLong_FromUnsignedLongLong(code);
    if (key == NULL)
        return NULL;
    PyObject *frame = PyDict_GetItemWithError(p->frames, key);
    if (frame != NULL) {
        Py_INCREF(frame);
    } else {
        if (PyErr_Occurred() || (frame = make_frame(p, pc, activation)) == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        if (PyDict_GET_SIZE(p->frames) >= p->max_symbols) {
            clear_frames(p);
            p->cache_resets++;
        }
        if (PyDict_SetItem(p->frames, key, frame) < 0) {
            Py_DECREF(key);
            Py_DECREF(frame);
            return NULL;
        }
    }
    Py_DECREF(key);
    Py_INCREF(frame);
    Py_XSETREF(slot->frame, frame);
    slot->key = code;
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
    memset(p->rules, 0, RULE_SLOTS * sizeof *p->rules);
    clear_frames(p);
    clear_symbols(p);
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
    if (p->frame_slots != NULL && p->stack_slots != NULL && p->frames != NULL)
        clear_frames(p);
    clear_symbols(p);
    free(p->rules);
    PyMem_Free(p->frame_slots);
    PyMem_Free(p->stack_slots);
    Py_XDECREF(p->factory);
    Py_XDECREF(p->frames);
    Py_XDECREF(p->markers);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *Process_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"pid", "factory", "max_symbols", "markers", NULL};
    int pid;
    PyObject *factory, *markers = Py_None;
    Py_ssize_t max_symbols = 65536;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO|nO", kwlist, &pid, &factory, &max_symbols, &markers))
        return NULL;
    if (markers != Py_None && (!PyTuple_Check(markers) || PyTuple_GET_SIZE(markers) != STOP_COUNT)) {
        PyErr_Format(PyExc_ValueError, "markers: None or a tuple of %d frames (one per REASONS)", STOP_COUNT);
        return NULL;
    }
    Process *p = (Process *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    p->pid = pid;
    p->max_symbols = max_symbols > 0 ? max_symbols : 1;
    p->fast = FAST_UNWIND;
    Py_INCREF(factory);
    p->factory = factory;
    Py_INCREF(markers);
    p->markers = markers;
    p->frames = PyDict_New();
    p->rules = aligned_alloc(64, RULE_SLOTS * sizeof *p->rules);
    if (p->rules != NULL)
        memset(p->rules, 0, RULE_SLOTS * sizeof *p->rules);
    p->frame_slots = PyMem_Calloc(FRAME_SLOTS, sizeof *p->frame_slots);
    p->stack_slots = PyMem_Calloc(STACK_SLOTS, sizeof *p->stack_slots);
    p->dwfl = dwfl_begin(&DWFL_CALLBACKS);
    if (p->frames == NULL || p->rules == NULL || p->frame_slots == NULL || p->stack_slots == NULL
        || p->dwfl == NULL) {
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

#if defined(__x86_64__)
/* struct pt_regs word of each DWARF register (rax rdx rcx rbx rsi rdi rbp rsp r8..r15 rip). */
static const unsigned char PT_REGS_OF_DWARF[17] = {10, 12, 11, 5, 13, 14, 4, 19, 9, 8, 7, 6, 3, 2, 1, 0, 16};
#define PT_REGS_WORDS 21
#endif

/* The registers of a sample: a sequence of ints in DWARF order, or (x86-64) a
 * bytes-like struct pt_regs as BPF copied it. */
static int load_regs(Process *p, PyObject *regs)
{
#if defined(__x86_64__)
    if (PyObject_CheckBuffer(regs)) {
        Py_buffer view;
        if (PyObject_GetBuffer(regs, &view, PyBUF_SIMPLE) < 0)
            return -1;
        if (view.len < (Py_ssize_t)(PT_REGS_WORDS * sizeof(uint64_t))) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "a struct pt_regs is %d bytes", PT_REGS_WORDS * 8);
            return -1;
        }
        for (unsigned i = 0; i < ARCH.input_nregs; i++)
            memcpy(&p->regs[i], (const char *)view.buf + 8 * PT_REGS_OF_DWARF[i], 8);
        PyBuffer_Release(&view);
        return 0;
    }
#endif
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

/* The walk's frames as a tuple, ending in the marker of its stop reason (when
 * markers were given); the same walk again gives the same tuple object. */
static PyObject *frames_tuple(Process *p, int stop)
{
    PyObject *marker = p->markers != Py_None && stop != STOP_NONE ? PyTuple_GET_ITEM(p->markers, stop) : NULL;
    uint64_t hash = 1469598103934665603ULL ^ (uint64_t)stop;
    for (int i = 0; i < p->n; i++)
        hash = (hash ^ (p->pcs[i] << 1 | p->acts[i])) * 1099511628211ULL;
    StackSlot *slot = NULL;
    if (p->n <= STACK_MAX_INTERN) {
        slot = &p->stack_slots[(hash ^ (hash >> 29)) & (STACK_SLOTS - 1)];
        if (slot->tuple != NULL && slot->hash == hash && slot->n == p->n && slot->stop == stop) {
            int same = 1;
            for (int i = 0; i < p->n && same; i++)
                same = slot->keys[i] == (p->pcs[i] << 1 | p->acts[i]);
            if (same) {
                Py_INCREF(slot->tuple);
                return slot->tuple;
            }
        }
    }
    PyObject *frames = PyTuple_New(p->n + (marker != NULL));
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
    if (marker != NULL) {
        Py_INCREF(marker);
        PyTuple_SET_ITEM(frames, p->n, marker);
    }
    if (slot != NULL) {
        /* frame_for may have cleared every slot (a full cache): fill this one afresh */
        uint64_t *keys = PyMem_Realloc(slot->keys, (p->n ? p->n : 1) * sizeof *keys);
        if (keys != NULL) {
            for (int i = 0; i < p->n; i++)
                keys[i] = p->pcs[i] << 1 | p->acts[i];
            slot->keys = keys;
            slot->hash = hash;
            slot->n = p->n;
            slot->stop = stop;
            Py_INCREF(frames);
            Py_XSETREF(slot->tuple, frames);
        }
    }
    return frames;
}

PyDoc_STRVAR(unwind_doc,
"unwind(regs, stack_addr, stack, max_frames=127) -> (frames, stop)\n\n"
"Unwinds one sample: regs in DWARF order (or, on x86-64, the bytes of a struct\n"
"pt_regs), stack the bytes copied from stack_addr.\n"
"frames: Frame objects, leaf first, ending in markers[stop] when the walk stopped\n"
"early and markers were given; stop: an index into REASONS (0: complete).\n"
"The same walk gives the same tuple object while it stays cached.");

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
    p->max = max_frames < 1 ? 1 : max_frames > MAX_FRAMES_CAP ? MAX_FRAMES_CAP : max_frames;
    int stop = -1;
    if (p->fast) {
        p->read_outside = 0;
        p->n = 0;
        p->stop = STOP_NONE;
        if (fast_walk(p) == FAST_DONE) {
            stop = fast_stop_reason(p);
            p->fast_walks++;
        }
    }
    if (stop < 0) {
        p->read_outside = 0;
        p->n = 0;
        p->stop = STOP_NONE;
        int rc = dwfl_getthread_frames(p->dwfl, p->pid, on_frame, p);
        stop = stop_reason(p, rc);
        p->libdw_walks++;
    }
    p->stack = NULL;
    PyBuffer_Release(&stack);
    PyObject *frames = frames_tuple(p, stop);
    if (frames == NULL)
        return NULL;
    return Py_BuildValue("(Ni)", frames, stop);
}

/* The Frame naming an address (not a return address: the symbol at pc itself), from the
 * same caches as the walks: a GPU kernel's host function named by its symbol. */
static PyObject *Process_frame_at(Process *p, PyObject *args)
{
    unsigned long long pc;
    if (!PyArg_ParseTuple(args, "K", &pc))
        return NULL;
    current_pid = p->pid;
    return frame_for(p, (uint64_t)pc, 1);
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

static PyObject *Process_get_fast(Process *p, void *closure)
{
    (void)closure;
    return PyBool_FromLong(p->fast);
}

static int Process_set_fast(Process *p, PyObject *value, void *closure)
{
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "fast cannot be deleted");
        return -1;
    }
    int on = PyObject_IsTrue(value);
    if (on < 0)
        return -1;
    p->fast = on && FAST_UNWIND;
    return 0;
}

static PyObject *Process_get_walks(Process *p, void *closure)
{
    (void)closure;
    return Py_BuildValue("{sKsKsKsKsKsK}", "fast", p->fast_walks, "libdw", p->libdw_walks, "rule_misses",
                         p->rule_misses, "symbol_lookups", p->symbol_lookups, "symbol_range_hits",
                         p->symbol_range_hits, "symbol_index_hits", p->symbol_index_hits);
}

static PyMethodDef Process_methods[] = {
    {"unwind", (PyCFunction)Process_unwind, METH_VARARGS, unwind_doc},
    {"frame_at", (PyCFunction)Process_frame_at, METH_VARARGS,
     "frame_at(pc) -> Frame: the symbol at the address pc itself (not a return address), as the walks name frames"},
    {"refresh", (PyCFunction)Process_refresh, METH_NOARGS,
     "Re-reads /proc/PID/maps (a library was dlopen'ed) and drops the per-PC caches."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Process_getset[] = {
    {"cache_resets", (getter)Process_get_cache_resets, NULL, "times the frame cache was full and cleared", NULL},
    {"cached_frames", (getter)Process_get_cached_frames, NULL, "frames in the cache now", NULL},
    {"fast", (getter)Process_get_fast, (setter)Process_set_fast,
     "walk with the per-PC rule cache (x86-64; libdw's walk where a frame needs it) and name through the "
     "remembered symbol ranges; False: libdw alone (a reference for tests)", NULL},
    {"walks", (getter)Process_get_walks, NULL,
     "counters: walks done by the rule cache, by libdw, and rule cache misses", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ProcessType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otelbpf.profiles.native._dwunwind.Process",
    .tp_doc = PyDoc_STR("Process(pid, factory, max_symbols=65536, markers=None): one process's Dwfl and caches."),
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
