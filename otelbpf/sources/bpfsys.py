"""The few bpf(2) commands BCC 0.26 does not wrap, called directly.

* :func:`link_cgroup`: attach a program to a cgroup through a BPF *link*
  (BPF_LINK_CREATE). A link lives as long as its fd: when the agent exits,
  however it exits (SIGKILL included), the kernel detaches the program. BCC's
  ``attach_func`` uses BPF_PROG_ATTACH instead, which stays attached after
  the process is gone until someone detaches it: not acceptable for a
  program on the host's root cgroup.
* :func:`cgroup_programs`: which programs are attached to a cgroup for an
  attach type (BPF_PROG_QUERY), with their names: ``otelbpf doctor`` and the
  tests use it to see what is there (another agent's sock_ops program, ours
  left behind).
* :func:`loaded_programs`: every BPF program loaded on the host, by type
  (BPF_PROG_GET_NEXT_ID): a CNI's sockmap programs (Cilium) are found so.

Root (CAP_SYS_ADMIN or CAP_BPF) is needed for all of them.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from dataclasses import dataclass

#: bpf(2) syscall numbers.
SYS_BPF = {"x86_64": 321, "aarch64": 280}

# enum bpf_cmd
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_NEXT_ID = 11
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
BPF_LINK_CREATE = 28

# enum bpf_attach_type
BPF_CGROUP_SOCK_OPS = 3
BPF_SK_MSG_VERDICT = 7

# enum bpf_prog_type
BPF_PROG_TYPE_SK_SKB = 14
BPF_PROG_TYPE_SOCK_OPS = 13
BPF_PROG_TYPE_SK_MSG = 16

#: union bpf_attr is at most this big in any kernel we meet; the kernel reads what it knows.
ATTR_SIZE = 128
#: struct bpf_prog_info: where its name lies, and how much of it we read.
PROG_INFO_SIZE = 88
PROG_INFO_NAME = 64

_libc = ctypes.CDLL(None, use_errno=True)


class BpfError(OSError):
    """A bpf(2) command failed; errno and the command are in the message."""


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    number = SYS_BPF.get(platform.machine())
    if number is None:
        raise BpfError(0, f"no bpf(2) syscall number for {platform.machine()}")
    result = _libc.syscall(number, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        errno = ctypes.get_errno()
        raise BpfError(errno, f"bpf({cmd}): {os.strerror(errno)}")
    return result


def link_cgroup(prog_fd: int, cgroup_fd: int, attach_type: int = BPF_CGROUP_SOCK_OPS) -> int:
    """Attach ``prog_fd`` to the cgroup ``cgroup_fd`` through a link; returns the
    link's fd (close it to detach; the kernel does when the process ends). Other
    programs attached to the cgroup stay, and run beside it."""
    attr = ctypes.create_string_buffer(ATTR_SIZE)
    struct.pack_into("<IIII", attr, 0, prog_fd, cgroup_fd, attach_type, 0)
    return _bpf(BPF_LINK_CREATE, attr)


@dataclass(frozen=True)
class Program:
    id: int
    type: int
    name: str


def program_info(prog_id: int) -> Program | None:
    """Type and name of a loaded program, or None when it is gone."""
    attr = ctypes.create_string_buffer(ATTR_SIZE)
    struct.pack_into("<I", attr, 0, prog_id)
    try:
        fd = _bpf(BPF_PROG_GET_FD_BY_ID, attr)
    except BpfError:
        return None
    try:
        info = ctypes.create_string_buffer(PROG_INFO_SIZE)
        attr = ctypes.create_string_buffer(ATTR_SIZE)
        struct.pack_into("<IIQ", attr, 0, fd, PROG_INFO_SIZE, ctypes.addressof(info))
        _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
        prog_type, found_id = struct.unpack_from("<II", info, 0)
        name = info.raw[PROG_INFO_NAME : PROG_INFO_NAME + 16].split(b"\0", 1)[0].decode("ascii", "replace")
        return Program(found_id, prog_type, name)
    finally:
        os.close(fd)


def cgroup_programs(cgroup_path: str, attach_type: int = BPF_CGROUP_SOCK_OPS) -> list[Program]:
    """The programs attached to a cgroup (its own, not its ancestors') for ``attach_type``."""
    fd = os.open(cgroup_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ids = (ctypes.c_uint32 * 64)()
        attr = ctypes.create_string_buffer(ATTR_SIZE)
        struct.pack_into("<IIIIQI", attr, 0, fd, attach_type, 0, 0, ctypes.addressof(ids), len(ids))
        _bpf(BPF_PROG_QUERY, attr)
        count = struct.unpack_from("<I", attr, 24)[0]
    finally:
        os.close(fd)
    found = [program_info(ids[i]) for i in range(min(count, len(ids)))]
    return [p for p in found if p is not None]


def loaded_programs(types: tuple[int, ...] | None = None) -> list[Program]:
    """Every program loaded on the host (of ``types``, when given)."""
    found, current = [], 0
    while True:
        attr = ctypes.create_string_buffer(ATTR_SIZE)
        struct.pack_into("<I", attr, 0, current)
        try:
            _bpf(BPF_PROG_GET_NEXT_ID, attr)
        except BpfError:
            return found
        current = struct.unpack_from("<I", attr, 4)[0]
        program = program_info(current)
        if program is not None and (types is None or program.type in types):
            found.append(program)
