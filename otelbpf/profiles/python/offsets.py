"""Where CPython keeps frames, thread states and code objects, per version.

This module is the single source of the layout the BPF frame walker
consumes. ``struct py_offsets`` (little-endian, nine ``__u32``, in this
order; :meth:`PyOffsets.to_bytes` packs it)::

    struct py_offsets {
        __u32 version;              /* major << 8 | minor, e.g. 0x030b */
        __u32 tstate_frame;         /* in PyThreadState: 3.10 frame (PyFrameObject *),
                                       3.11/3.12 cframe (_PyCFrame *), 3.13+ current_frame */
        __u32 cframe_current_frame; /* in _PyCFrame (3.11/3.12); NONE otherwise */
        __u32 frame_previous;       /* 3.10 f_back; 3.11+ previous */
        __u32 frame_code;           /* 3.10/3.11/3.12 f_code; 3.13+ f_executable */
        __u32 frame_instr;          /* 3.10 f_lasti (int, instruction index);
                                       3.11/3.12 prev_instr; 3.13+ instr_ptr (pointers) */
        __u32 frame_owner;          /* char: 3.11 is_entry; 3.12+ owner; NONE on 3.10 */
        __u32 owner_kind;           /* OWNER_NONE / OWNER_IS_ENTRY / OWNER_SHIM */
        __u32 shim_owner;           /* OWNER_SHIM: owner values >= this are shims
                                       (3 = FRAME_OWNED_BY_CSTACK on 3.12/3.13; on 3.14
                                       3 = FRAME_OWNED_BY_INTERPRETER, 4 = ..._CSTACK) */
        __u32 tstate_mode;          /* where the thread's PyThreadState is read: 0 the
                                       tid map only, 1 *(fsbase + tls_offset), 2 through
                                       glibc's DTV (otelbpf/profiles/python/thread_local.py) */
        __u32 tls_module;           /* mode 2: the interpreter file's TLS module id */
        __u32 pad;
        __s64 tls_offset;           /* mode 1: from fsbase; mode 2: in the module's block */
    };

``NONE`` is 0xFFFFFFFF. The thread-state fields come from the process, not the version
(:func:`otelbpf.profiles.python.thread_local.find_tstate_source`, :meth:`PyOffsets.with_tstate`). Per frame the BPF side emits ``code`` (u64 read at
``frame_code``; on 3.14 a tagged ``_PyStackRef``, user space masks the low
bits), ``instr`` (u64 read at ``frame_instr``; on 3.10 only the low 32 bits,
the int ``f_lasti``, are used) and ``flags``: :data:`FLAG_ENDS_EVAL` (this
frame is the last Python frame of one ``_PyEval_EvalFrameDefault`` call: the
``is_entry`` frame, or the frame just before a shim; user space infers the
latter itself when BPF does not look back) and :data:`FLAG_SHIM` (not a code
frame; skipped). Testing ``owner == 3`` equals ``owner >= shim_owner`` up to
3.13; from 3.14 only the latter also skips FRAME_OWNED_BY_CSTACK (4) frames.

3.10-3.12 come from one table per version, checked against the pyenv builds'
DWARF by tests/test_profiles_python.py. 3.13+ are read from the
``_Py_DebugOffsets`` CPython itself puts at the start of ``_PyRuntime`` (ELF
section ``.PyRuntime``), so a new patch release needs nothing here; its
``version`` field selects the struct layout (3.14 grew it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

NONE = 0xFFFFFFFF

#: owner_kind values.
OWNER_NONE = 0  # 3.10: every frame is its own _PyEval_EvalFrameDefault call
OWNER_IS_ENTRY = 1  # 3.11: is_entry != 0 marks the last Python frame of an eval call
OWNER_SHIM = 2  # 3.12+: owner >= shim_owner marks a C-stack shim between eval calls

#: Per-frame flag bits emitted by BPF.
FLAG_ENDS_EVAL = 1
FLAG_SHIM = 2

#: Line-table formats of co_linetable.
LINETABLE_PEP626 = "pep626"  # 3.10: (byte delta, line delta) pairs
LINETABLE_LOCATIONS = "locations"  # 3.11+: the location table


@dataclass(frozen=True, slots=True)
class PyOffsets:
    """What the BPF program needs to follow one thread's frame chain."""

    version: int
    tstate_frame: int
    cframe_current_frame: int
    frame_previous: int
    frame_code: int
    frame_instr: int
    frame_owner: int
    owner_kind: int
    shim_owner: int = NONE
    #: where BPF reads the thread's PyThreadState (otelbpf/profiles/python/thread_local.py MODE_*)
    tstate_mode: int = 0
    tls_module: int = 0
    tls_offset: int = 0

    def to_bytes(self) -> bytes:
        """The value of the BPF map entry (``struct py_offsets``)."""
        return PY_OFFSETS.pack(
            self.version, self.tstate_frame, self.cframe_current_frame, self.frame_previous,
            self.frame_code, self.frame_instr, self.frame_owner, self.owner_kind, self.shim_owner,
            self.tstate_mode, self.tls_module, 0, self.tls_offset,
        )

    def with_tstate(self, mode: int, offset: int, module: int = 0) -> "PyOffsets":
        """These offsets, with the thread state read from the thread's TLS."""
        return replace(self, tstate_mode=mode, tls_offset=offset, tls_module=module)


#: ``struct py_offsets`` (bpf/profile.c): nine u32 of frame layout, the thread-state source.
PY_OFFSETS = struct.Struct("<" + "I" * 12 + "q")


@dataclass(frozen=True, slots=True)
class ThreadOffsets:
    """User space's walk of _PyRuntime -> interpreters -> thread states."""

    runtime_interpreters_head: int
    interp_next: int
    interp_threads_head: int
    tstate_next: int
    tstate_thread_id: int  # pthread_t (unsigned long)
    tstate_native_thread_id: int  # kernel tid (3.11+); NONE on 3.10


@dataclass(frozen=True, slots=True)
class CodeOffsets:
    """What naming a code object reads (PyCodeObject, and the str/bytes it points to)."""

    ob_type: int
    tp_name: int
    co_filename: int
    co_name: int
    co_qualname: int  # NONE on 3.10: co_name is the best there is
    co_firstlineno: int
    co_argcount: int
    co_linetable: int
    co_code_adaptive: int  # 3.11+: start of the instructions inside the code object; NONE on 3.10
    bytes_size: int  # PyVarObject.ob_size
    bytes_data: int  # PyBytesObject.ob_sval
    str_length: int  # PyASCIIObject.length
    str_state: int  # PyASCIIObject.state (kind bits 2-4, compact bit 5, ascii bit 6)
    str_ascii_data: int  # sizeof(PyASCIIObject): compact ASCII data follows
    str_compact_data: int  # sizeof(PyCompactUnicodeObject): compact non-ASCII data follows
    linetable: str  # LINETABLE_PEP626 or LINETABLE_LOCATIONS

    def header_size(self) -> int:
        """Bytes to read from a code object's start to get every field named here."""
        size = _HEADER_SIZES.get(self)
        if size is None:
            size = _HEADER_SIZES[self] = self._header_size()
        return size

    def _header_size(self) -> int:
        fields = (self.co_filename, self.co_name, self.co_qualname, self.co_firstlineno,
                  self.co_argcount, self.co_linetable, self.ob_type)
        return max(f for f in fields if f != NONE) + 8


_HEADER_SIZES: dict[CodeOffsets, int] = {}


@dataclass(frozen=True, slots=True)
class PythonLayout:
    """Everything version-specific about one interpreter build."""

    version: tuple[int, int]
    bpf: PyOffsets
    threads: ThreadOffsets
    code: CodeOffsets
    #: 3.14 stores f_executable as a tagged _PyStackRef: mask these bits off.
    code_tag_mask: int = 0


# --- 3.10-3.12: one table per version (checked against DWARF by the tests) ---

PY310 = PythonLayout(
    version=(3, 10),
    bpf=PyOffsets(version=0x030A, tstate_frame=24, cframe_current_frame=NONE, frame_previous=24,
                  frame_code=32, frame_instr=96, frame_owner=NONE, owner_kind=OWNER_NONE),
    threads=ThreadOffsets(runtime_interpreters_head=32, interp_next=0, interp_threads_head=8,
                          tstate_next=8, tstate_thread_id=176, tstate_native_thread_id=NONE),
    code=CodeOffsets(ob_type=8, tp_name=24, co_filename=104, co_name=112, co_qualname=NONE,
                     co_firstlineno=40, co_argcount=16, co_linetable=120, co_code_adaptive=NONE,
                     bytes_size=16, bytes_data=32, str_length=16, str_state=32, str_ascii_data=48,
                     str_compact_data=72, linetable=LINETABLE_PEP626),
)

PY311 = PythonLayout(
    version=(3, 11),
    bpf=PyOffsets(version=0x030B, tstate_frame=56, cframe_current_frame=8, frame_previous=48,
                  frame_code=32, frame_instr=56, frame_owner=68, owner_kind=OWNER_IS_ENTRY),
    threads=ThreadOffsets(runtime_interpreters_head=40, interp_next=0, interp_threads_head=16,
                          tstate_next=8, tstate_thread_id=152, tstate_native_thread_id=160),
    code=CodeOffsets(ob_type=8, tp_name=24, co_filename=112, co_name=120, co_qualname=128,
                     co_firstlineno=72, co_argcount=56, co_linetable=136, co_code_adaptive=184,
                     bytes_size=16, bytes_data=32, str_length=16, str_state=32, str_ascii_data=48,
                     str_compact_data=72, linetable=LINETABLE_LOCATIONS),
)

PY312 = PythonLayout(
    version=(3, 12),
    bpf=PyOffsets(version=0x030C, tstate_frame=56, cframe_current_frame=0, frame_previous=8,
                  frame_code=0, frame_instr=56, frame_owner=70, owner_kind=OWNER_SHIM, shim_owner=3),
    threads=ThreadOffsets(runtime_interpreters_head=40, interp_next=0, interp_threads_head=72,
                          tstate_next=8, tstate_thread_id=136, tstate_native_thread_id=144),
    code=CodeOffsets(ob_type=8, tp_name=24, co_filename=112, co_name=120, co_qualname=128,
                     co_firstlineno=68, co_argcount=52, co_linetable=136, co_code_adaptive=192,
                     bytes_size=16, bytes_data=32, str_length=16, str_state=32, str_ascii_data=40,
                     str_compact_data=56, linetable=LINETABLE_LOCATIONS),
)

TABLES: dict[tuple[int, int], PythonLayout] = {l.version: l for l in (PY310, PY311, PY312)}


# --- 3.13+: _Py_DebugOffsets, read from the binary ---

DEBUG_COOKIE = b"xdebugpy"

#: Index (in u64 words from the struct start) of each value we use, per layout.
#: 3.13: cookie(1) version free_threaded | runtime_state{size finalizing interpreters_head}
#: interpreter_state{size id next threads_head gc ... 13 words} thread_state{9 words}
#: interpreter_frame{size previous executable instr_ptr localsplus owner}
#: code_object{size filename name qualname linetable firstlineno argcount
#: localsplusnames localspluskinds co_code_adaptive} pyobject{size ob_type}
#: type_object{size tp_name tp_repr tp_flags} tuple{3} list{3} dict{3} float{2}
#: long{3} bytes{size ob_size ob_sval} unicode{size state length asciiobject_size}.
_WORDS_313 = dict(
    version=1, free_threaded=2, interpreters_head=5,
    interp_next=8, interp_threads_head=9,
    tstate_next=21, tstate_current_frame=23, tstate_thread_id=24, tstate_native_thread_id=25,
    frame_previous=29, frame_executable=30, frame_instr_ptr=31, frame_owner=33,
    co_filename=35, co_name=36, co_qualname=37, co_linetable=38, co_firstlineno=39,
    co_argcount=40, co_code_adaptive=43, pyobject_size=44, ob_type=45, tp_name=47,
    bytes_ob_size=65, bytes_ob_sval=66, str_state=68, str_length=69, str_ascii_size=70,
)

#: 3.14 (untested: no 3.14 build here) inserts interpreter_state.threads_main after
#: threads_head and code_object_generation + tlbc_generation at its end (+3 words),
#: interpreter_frame.stackpointer + tlbc_index (+2) and code_object.co_tlbc (+1).
#: Later sections (set_object in newer builds) move, so the str/bytes values past
#: type_object are taken from 3.13's, which 3.14's object headers keep.
_WORDS_314 = dict(
    version=1, free_threaded=2, interpreters_head=5,
    interp_next=8, interp_threads_head=9,
    tstate_next=24, tstate_current_frame=26, tstate_thread_id=27, tstate_native_thread_id=28,
    frame_previous=32, frame_executable=33, frame_instr_ptr=34, frame_owner=36,
    co_filename=40, co_name=41, co_qualname=42, co_linetable=43, co_firstlineno=44,
    co_argcount=45, co_code_adaptive=48, pyobject_size=50, ob_type=51, tp_name=53,
)

_STR_BYTES_313 = dict(bytes_ob_size=16, bytes_ob_sval=32, str_state=32, str_length=16, str_ascii_size=40)

#: PyCompactUnicodeObject adds utf8_length and utf8 to PyASCIIObject (3.12+).
_COMPACT_EXTRA = 16


def debug_offsets_size() -> int:
    """Bytes of ``.PyRuntime`` to read: enough for the largest layout we parse."""
    return (max(max(_WORDS_313.values()), max(_WORDS_314.values())) + 1) * 8


def from_debug_offsets(data: bytes) -> PythonLayout | str:
    """Parse ``_Py_DebugOffsets`` (the start of ``.PyRuntime``) into a layout,
    or say why not (a string) for a free-threaded build or an unknown layout."""
    if len(data) < debug_offsets_size() or data[:8] != DEBUG_COOKIE:
        return "no _Py_DebugOffsets cookie in .PyRuntime"
    words = struct.unpack_from(f"<{len(data) // 8}Q", data)
    hexversion = words[1]
    major, minor = hexversion >> 24, (hexversion >> 16) & 0xFF
    if (major, minor) == (3, 13):
        index = _WORDS_313
    elif (major, minor) == (3, 14):
        index = _WORDS_314
    else:
        return f"CPython {major}.{minor}: unknown _Py_DebugOffsets layout"
    w = {name: words[i] for name, i in index.items()}
    if w["free_threaded"]:
        return f"CPython {major}.{minor} free-threaded build: not supported"
    if w["pyobject_size"] != 16 or w["ob_type"] != 8:
        return f"CPython {major}.{minor}: _Py_DebugOffsets does not parse as expected"
    w = {**_STR_BYTES_313, **w}
    return _layout_from_words(major, minor, w)


def _layout_from_words(major: int, minor: int, w: dict[str, int]) -> PythonLayout:
    """Build the layout from the parsed _Py_DebugOffsets values."""
    shim_owner = 3  # 3.13 FRAME_OWNED_BY_CSTACK; 3.14 FRAME_OWNED_BY_INTERPRETER (CSTACK is 4)
    return PythonLayout(
        version=(major, minor),
        bpf=PyOffsets(version=major << 8 | minor, tstate_frame=w["tstate_current_frame"],
                      cframe_current_frame=NONE, frame_previous=w["frame_previous"],
                      frame_code=w["frame_executable"], frame_instr=w["frame_instr_ptr"],
                      frame_owner=w["frame_owner"], owner_kind=OWNER_SHIM, shim_owner=shim_owner),
        threads=ThreadOffsets(runtime_interpreters_head=w["interpreters_head"],
                              interp_next=w["interp_next"], interp_threads_head=w["interp_threads_head"],
                              tstate_next=w["tstate_next"], tstate_thread_id=w["tstate_thread_id"],
                              tstate_native_thread_id=w["tstate_native_thread_id"]),
        code=CodeOffsets(ob_type=w["ob_type"], tp_name=w["tp_name"], co_filename=w["co_filename"],
                         co_name=w["co_name"], co_qualname=w["co_qualname"],
                         co_firstlineno=w["co_firstlineno"], co_argcount=w["co_argcount"],
                         co_linetable=w["co_linetable"], co_code_adaptive=w["co_code_adaptive"],
                         bytes_size=w["bytes_ob_size"], bytes_data=w["bytes_ob_sval"],
                         str_length=w["str_length"], str_state=w["str_state"],
                         str_ascii_data=w["str_ascii_size"],
                         str_compact_data=w["str_ascii_size"] + _COMPACT_EXTRA,
                         linetable=LINETABLE_LOCATIONS),
        code_tag_mask=7 if minor >= 14 else 0,
    )


def table_layout(version: tuple[int, int]) -> PythonLayout | str:
    """The built-in table for 3.10-3.12, or why there is none."""
    layout = TABLES.get(version)
    if layout is not None:
        return layout
    if version < (3, 10):
        return f"CPython {version[0]}.{version[1]}: no offsets, native stacks only"
    return f"CPython {version[0]}.{version[1]}: no _Py_DebugOffsets and no table"
