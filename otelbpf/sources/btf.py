"""A small reader of the kernel's BTF (/sys/kernel/btf/vmlinux): struct member
offsets and raw-tracepoint prototypes, resolved in user space.

BCC compiles the probes against whatever kernel headers it finds (often a
fallback of another version, DEVELOPERS.md), so the probes never read a kernel
struct by header layout. Where a probe must read a field (the raw
sock:sock_{recv,send}_length tracepoints get only ``struct sock *``), user
space looks its offset up here, in the running kernel's own type
information, and passes it in as a -D flag.

The format (the kernel's Documentation/bpf/btf.rst): a header, a type section
(``struct btf_type`` records, each followed by kind-specific data; type ids
count from 1 in order) and a string section. The file (a few MB) is read in
one go and walked once with ``struct.unpack_from``, recording where each type
starts; lookups then decode only the types they visit. :func:`load` caches
the parsed file per path.
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass

VMLINUX = "/sys/kernel/btf/vmlinux"
MAGIC = 0xEB9F

KIND_INT = 1
KIND_PTR = 2
KIND_ARRAY = 3
KIND_STRUCT = 4
KIND_UNION = 5
KIND_ENUM = 6
KIND_FWD = 7
KIND_TYPEDEF = 8
KIND_VOLATILE = 9
KIND_CONST = 10
KIND_RESTRICT = 11
KIND_FUNC = 12
KIND_FUNC_PROTO = 13
KIND_VAR = 14
KIND_DATASEC = 15
KIND_FLOAT = 16
KIND_DECL_TAG = 17
KIND_TYPE_TAG = 18
KIND_ENUM64 = 19

#: Bytes following ``struct btf_type`` (12 bytes): (fixed, per vlen item).
_EXTRA = {
    KIND_INT: (4, 0),
    KIND_ARRAY: (12, 0),
    KIND_STRUCT: (0, 12),
    KIND_UNION: (0, 12),
    KIND_ENUM: (0, 8),
    KIND_FUNC_PROTO: (0, 8),
    KIND_VAR: (4, 0),
    KIND_DATASEC: (0, 12),
    KIND_DECL_TAG: (4, 0),
    KIND_ENUM64: (0, 12),
}
#: Kinds that only qualify or rename another type (followed when descending).
_MODIFIERS = (KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG)
POINTER_SIZE = 8


class BtfError(Exception):
    """BTF missing, malformed, or without what was asked for; the message says which."""


@dataclass(frozen=True)
class Member:
    """Where a (possibly nested) member lies in its outermost struct."""

    path: str
    bit_offset: int
    #: Bits the member occupies: its type's size for an ordinary member, the width for a bitfield.
    bit_size: int
    #: Size in bytes of the member's type (after typedefs and qualifiers).
    type_size: int
    type_name: str
    bitfield: bool

    @property
    def offset(self) -> int:
        """Byte offset; only meaningful when the member is byte-aligned (see :meth:`byte_field`)."""
        return self.bit_offset // 8

    def byte_field(self) -> tuple[int, int]:
        """(byte offset, byte size) of a member a probe can read as a whole.
        Raises BtfError for a bitfield that is not a byte-aligned 8/16/32/64-bit field."""
        if self.bit_offset % 8 or self.bit_size not in (8, 16, 32, 64):
            raise BtfError(
                f"{self.path}: a bitfield at bit {self.bit_offset}, {self.bit_size} bits wide, cannot be read as a"
                " whole byte-aligned field"
            )
        return self.bit_offset // 8, self.bit_size // 8


class Btf:
    """A parsed BTF blob (base BTF: ids 1..n)."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 24:
            raise BtfError("BTF: too short for a header")
        for endian in ("<", ">"):
            if struct.unpack_from(endian + "H", data, 0)[0] == MAGIC:
                break
        else:
            raise BtfError(f"BTF: bad magic {data[:2].hex()}")
        self._e = endian
        _magic, version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(endian + "HBBIIIII", data, 0)
        if version != 1:
            raise BtfError(f"BTF: version {version} (expected 1)")
        types_start = hdr_len + type_off
        strs_start = hdr_len + str_off
        if types_start + type_len > len(data) or strs_start + str_len > len(data):
            raise BtfError("BTF: sections run past the end of the data")
        self._data = data
        self._strs = data[strs_start : strs_start + str_len]
        self._types_start = types_start
        #: offset in data of each type record; index = type id (0: void)
        self._offsets: list[int] = [0]
        self._walk(types_start, types_start + type_len)

    def _walk(self, pos: int, end: int) -> None:
        unpack = struct.Struct(self._e + "III").unpack_from
        extra = _EXTRA
        offsets = self._offsets
        append = offsets.append
        data = self._data
        while pos < end:
            append(pos)
            info = unpack(data, pos)[1]
            fixed, per = extra.get((info >> 24) & 0x1F, (0, 0))
            pos += 12 + fixed + per * (info & 0xFFFF)
        if pos != end:
            raise BtfError("BTF: type section does not end on a type boundary")

    # -- low level --------------------------------------------------------

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def name(self, name_off: int) -> str:
        end = self._strs.find(b"\0", name_off)
        return self._strs[name_off : end if end >= 0 else None].decode("utf-8", "replace")

    def type(self, type_id: int) -> tuple[int, str, int, bool, int, int]:
        """(kind, name, vlen, kind_flag, size_or_type, record offset) of a type id."""
        if not 0 < type_id < len(self._offsets):
            raise BtfError(f"BTF: no type id {type_id}")
        pos = self._offsets[type_id]
        name_off, info, size_or_type = struct.unpack_from(self._e + "III", self._data, pos)
        return (info >> 24) & 0x1F, self.name(name_off), info & 0xFFFF, bool(info >> 31), size_or_type, pos

    def _items(self, pos: int, count: int, fmt: str, size: int):
        unpack = struct.Struct(self._e + fmt).unpack_from
        for i in range(count):
            yield unpack(self._data, pos + 12 + i * size)

    def find(self, name: str, kinds: tuple[int, ...]) -> list[int]:
        """Type ids named ``name`` of one of ``kinds``."""
        target = name.encode()
        # one scan comparing name offsets, not decoding every name: first every
        # string offset that reads ``name`` (a name may share another's tail)
        wanted = set()
        at = self._strs.find(target + b"\0")
        while at >= 0:
            wanted.add(at)
            at = self._strs.find(target + b"\0", at + 1)
        unpack = struct.Struct(self._e + "II").unpack_from
        data = self._data
        found = []
        for type_id in range(1, len(self._offsets)):
            name_off, info = unpack(data, self._offsets[type_id])
            if name_off in wanted and (info >> 24) & 0x1F in kinds:
                found.append(type_id)
        return found

    def resolve(self, type_id: int) -> int:
        """Follow typedefs and qualifiers to the underlying type id."""
        for _ in range(64):
            if type_id == 0:
                return 0
            kind, _name, _vlen, _kf, target, _pos = self.type(type_id)
            if kind not in _MODIFIERS:
                return type_id
            type_id = target
        raise BtfError(f"BTF: type chain too long at id {type_id}")

    def size_of(self, type_id: int) -> int:
        type_id = self.resolve(type_id)
        if type_id == 0:
            return 0
        kind, _name, _vlen, _kf, size, pos = self.type(type_id)
        if kind in (KIND_INT, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FLOAT, KIND_DATASEC):
            return size
        if kind == KIND_PTR:
            return POINTER_SIZE
        if kind == KIND_ARRAY:
            elem, _index, nelems = struct.unpack_from(self._e + "III", self._data, pos + 12)
            return nelems * self.size_of(elem)
        raise BtfError(f"BTF: type id {type_id} (kind {kind}) has no size")

    def type_name(self, type_id: int) -> str:
        """A C-ish spelling of a type, for messages and checks."""
        if type_id == 0:
            return "void"
        kind, name, _vlen, _kf, target, _pos = self.type(type_id)
        if kind == KIND_PTR:
            return self.type_name(target) + " *"
        if kind in (KIND_CONST, KIND_VOLATILE, KIND_RESTRICT):
            return {KIND_CONST: "const ", KIND_VOLATILE: "volatile ", KIND_RESTRICT: "restrict "}[kind] + self.type_name(target)
        if kind == KIND_TYPE_TAG:
            return self.type_name(target)
        if kind in (KIND_STRUCT, KIND_FWD) and not (kind == KIND_FWD and _kf):
            return f"struct {name or '<anon>'}"
        if kind == KIND_UNION or (kind == KIND_FWD and _kf):
            return f"union {name or '<anon>'}"
        if kind in (KIND_ENUM, KIND_ENUM64):
            return f"enum {name or '<anon>'}"
        if kind == KIND_FUNC_PROTO:
            return "<function>"
        return name or f"<kind {kind}>"

    # -- members ----------------------------------------------------------

    def struct_id(self, name: str) -> int:
        """The id of ``struct name`` (a definition, not a forward declaration)."""
        ids = [t for t in self.find(name, (KIND_STRUCT,)) if self.type(t)[2] > 0]
        if not ids:
            raise BtfError(f"BTF: no struct {name}")
        return ids[0]

    def members(self, type_id: int) -> list[tuple[str, int, int, int]]:
        """(name, type id, bit offset, bitfield size or 0) of a struct/union's members."""
        kind, name, vlen, kind_flag, _size, pos = self.type(type_id)
        if kind not in (KIND_STRUCT, KIND_UNION):
            raise BtfError(f"BTF: {self.type_name(type_id)} is not a struct or union")
        out = []
        for name_off, member_type, offset in self._items(pos, vlen, "III", 12):
            if kind_flag:
                bit_offset, bitfield = offset & 0xFFFFFF, offset >> 24
            else:
                bit_offset, bitfield = offset, 0
            out.append((self.name(name_off), member_type, bit_offset, bitfield))
        return out

    def _find_member(self, type_id: int, name: str, base: int) -> tuple[int, int, int] | None:
        """(type id, bit offset from the outer struct, bitfield size) of ``name``,
        looking through anonymous struct/union members."""
        for member_name, member_type, bit_offset, bitfield in self.members(type_id):
            if member_name == name:
                return member_type, base + bit_offset, bitfield
            if not member_name:
                inner = self.resolve(member_type)
                if inner and self.type(inner)[0] in (KIND_STRUCT, KIND_UNION):
                    found = self._find_member(inner, name, base + bit_offset)
                    if found is not None:
                        return found
        return None

    def member(self, struct_name: str, path: str) -> Member:
        """The member at ``path`` ("a.b.c") of ``struct struct_name``."""
        type_id = self.struct_id(struct_name)
        bit_offset = 0
        member_type = type_id
        bitfield = 0
        parts = path.split(".")
        for i, part in enumerate(parts):
            container = self.resolve(member_type)
            if container == 0 or self.type(container)[0] not in (KIND_STRUCT, KIND_UNION):
                raise BtfError(f"BTF: struct {struct_name}: {'.'.join(parts[:i])} is not a struct or union")
            found = self._find_member(container, part, bit_offset)
            if found is None:
                raise BtfError(f"BTF: struct {struct_name} has no member {'.'.join(parts[: i + 1])}")
            member_type, bit_offset, bitfield = found
            if bitfield and i < len(parts) - 1:
                raise BtfError(f"BTF: struct {struct_name}: {'.'.join(parts[: i + 1])} is a bitfield")
        type_size = self.size_of(member_type)
        resolved = self.resolve(member_type)
        if not bitfield and resolved and self.type(resolved)[0] == KIND_INT:
            # old-style bitfield (no kind_flag): the int's own encoding says its bits
            encoding = struct.unpack_from(self._e + "I", self._data, self.type(resolved)[5] + 12)[0]
            nr_bits, int_offset = encoding & 0xFF, (encoding >> 16) & 0xFF
            if nr_bits != type_size * 8 or int_offset:
                bit_offset += int_offset
                bitfield = nr_bits
        return Member(
            path=f"{struct_name}.{path}",
            bit_offset=bit_offset,
            bit_size=bitfield or type_size * 8,
            type_size=type_size,
            type_name=self.type_name(member_type),
            bitfield=bool(bitfield),
        )

    def raw_tracepoint_args(self, tracepoint: str) -> list[str]:
        """The argument types of a raw tracepoint (``btf_trace_<name>``, a
        pointer to ``void (void *, args...)``), without the leading context pointer."""
        ids = self.find(f"btf_trace_{tracepoint}", (KIND_TYPEDEF,))
        if not ids:
            raise BtfError(f"BTF: no btf_trace_{tracepoint} (no such tracepoint in this kernel)")
        pointer = self.resolve(ids[0])
        kind, _name, _vlen, _kf, target, _pos = self.type(pointer)
        if kind != KIND_PTR or self.type(self.resolve(target))[0] != KIND_FUNC_PROTO:
            raise BtfError(f"BTF: btf_trace_{tracepoint} is not a function pointer")
        _kind, _name, vlen, _kf, _ret, pos = self.type(self.resolve(target))
        params = [self.type_name(param_type) for _name_off, param_type in self._items(pos, vlen, "II", 8)]
        return params[1:]


@functools.lru_cache(maxsize=4)
def _load(path: str, _stamp: tuple[int, int]) -> Btf:
    with open(path, "rb") as f:
        return Btf(f.read())


def load(path: str = VMLINUX) -> Btf:
    """The parsed BTF at ``path`` (cached while the file is unchanged). Raises BtfError."""
    try:
        st = os.stat(path)
        return _load(path, (st.st_mtime_ns, st.st_size))
    except OSError as exc:
        raise BtfError(f"cannot read {path}: {exc.strerror or exc}") from exc


def member_offset(struct_name: str, path: str, btf_path: str = VMLINUX) -> Member:
    """``member_offset("sock", "__sk_common.skc_family")``: see :meth:`Btf.member`."""
    return load(btf_path).member(struct_name, path)
