"""OBI's TCP option, as OBI's own source defines it, for the interoperability tests.

OpenTelemetry eBPF Instrumentation (OBI, formerly Beyla) puts the trace context
of a request in a TCP option (``bpf/tpinjector/tp_options.h``)::

    enum {
        k_tcp_option_kind_otel = 25,
        k_tcp_option_otel_legacy_len = 26,
        k_tcp_option_otel_extended_len = 27,
    };
    typedef struct otel_tcp_option {
        u8 kind;
        u8 len;
        unsigned char trace_id[TRACE_ID_SIZE_BYTES];   // 16
        unsigned char span_id[SPAN_ID_SIZE_BYTES];     // 8
    } otel_tcp_option_t;
    typedef struct otel_tcp_extended_option {
        otel_tcp_option_t legacy;
        u8 flags;
    } otel_tcp_extended_option_t;

The legacy layout (len 26) is written whenever the sampled flag is set, the
extended one (len 27, W3C flags & 3) otherwise; a reader takes ``ret == 26 &&
len == 26`` (flags = sampled) or ``ret == 27 && len == 27``. The span id is the
client span's, the server's parent.

Here: a parser of captured TCP options by that layout (:func:`otel_option`),
and :class:`ObiStyleWriter`, a sock_ops program compiled from the structs above
that writes the option as OBI's tpinjector does (the flag set at
ACTIVE_ESTABLISHED, the room reserved in HDR_OPT_LEN_CB, for tcp_current_mss
too, the option stored once, then forgotten), with ids the test chooses. OBI
arms it at the request's sendmsg, so the next header built is the request's
first data segment; this one is armed before the connection exists, so it
waits for a segment with data (the handshake's last ACK is not parsed by any
reader: the kernel skips header options in SYN_RECV).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import dpkt

KIND_OTEL = 25
LEGACY_LEN = 26
EXTENDED_LEN = 27
FLAG_SAMPLED = 1


@dataclass(frozen=True)
class OtelOption:
    trace_id: bytes
    span_id: bytes
    flags: int
    length: int


def tcp_options(raw: bytes) -> list[tuple[int, bytes]]:
    """(kind, whole option bytes) of a TCP header's options (NOP and EOL included)."""
    found, at = [], 0
    while at < len(raw):
        kind = raw[at]
        if kind in (0, 1):
            found.append((kind, raw[at : at + 1]))
            at += 1
            if kind == 0:
                break
            continue
        if at + 1 >= len(raw) or raw[at + 1] < 2:
            break
        length = raw[at + 1]
        found.append((kind, raw[at : at + length]))
        at += length
    return found


def otel_option(option: bytes) -> OtelOption | None:
    """OBI's reading of one option: valid_otel_tcp_option and otel_tcp_flags."""
    if len(option) == LEGACY_LEN and option[:2] == bytes((KIND_OTEL, LEGACY_LEN)):
        return OtelOption(option[2:18], option[18:26], FLAG_SAMPLED, LEGACY_LEN)
    if len(option) == EXTENDED_LEN and option[:2] == bytes((KIND_OTEL, EXTENDED_LEN)):
        return OtelOption(option[2:18], option[18:26], option[26] & 3, EXTENDED_LEN)
    return None


@dataclass(frozen=True)
class Segment:
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    payload: bytes
    options: list[tuple[int, bytes]]


def segments(pcap_path: str) -> list[Segment]:
    """The TCP segments of a capture (Ethernet or Linux cooked), IPv4 and IPv6."""
    import socket

    out = []
    with open(pcap_path, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        link = reader.datalink()
        for _ts, buf in reader:
            frame = dpkt.sll.SLL(buf) if link == dpkt.pcap.DLT_LINUX_SLL else dpkt.ethernet.Ethernet(buf)
            ip = frame.data
            if isinstance(ip, dpkt.ip.IP):
                family, src, dst = socket.AF_INET, ip.src, ip.dst
            elif isinstance(ip, dpkt.ip6.IP6):
                family, src, dst = socket.AF_INET6, ip.src, ip.dst
            else:
                continue
            tcp = ip.data
            if not isinstance(tcp, dpkt.tcp.TCP):
                continue
            out.append(Segment(socket.inet_ntop(family, src), socket.inet_ntop(family, dst), tcp.sport, tcp.dport,
                               tcp.seq, bytes(tcp.data), tcp_options(bytes(tcp.opts))))  # fmt: skip
    return out


WRITER = r"""
#include <uapi/linux/bpf.h>

/* bpf/tpinjector/tp_options.h of OBI */
enum {
    k_tcp_option_kind_otel = 25,
    k_tcp_option_otel_legacy_len = 26,
    k_tcp_option_otel_extended_len = 27,
};
typedef struct otel_tcp_option {
    u8 kind;
    u8 len;
    unsigned char trace_id[16];
    unsigned char span_id[8];
} otel_tcp_option_t;
typedef struct otel_tcp_extended_option {
    otel_tcp_option_t legacy;
    u8 flags;
} otel_tcp_extended_option_t;

/* what the test wants on the next request: the ids, the W3C flags; armed = 1 */
struct scheduled {
    unsigned char trace_id[16];
    unsigned char span_id[8];
    u8 flags;
    u8 armed;
};
BPF_ARRAY(next_request, struct scheduled, 1);
BPF_ARRAY(written, u64, 1);

int obi_style_writer(struct bpf_sock_ops *skops)
{
    int zero = 0;
    if (skops->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB) {
        bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
        return 1;
    }
    struct scheduled *s = next_request.lookup(&zero);
    if (!s || !s->armed)
        return 1;
    if (skops->op == BPF_SOCK_OPS_HDR_OPT_LEN_CB) {
        if (!(skops->args[0] & BPF_WRITE_HDR_TCP_CURRENT_MSS) && skops->skb_len == 0)
            return 1; /* a pure ACK: the request's data comes next */
        bpf_reserve_hdr_opt(skops, (s->flags & 1) ? sizeof(otel_tcp_option_t) : sizeof(otel_tcp_extended_option_t), 0);
    } else if (skops->op == BPF_SOCK_OPS_WRITE_HDR_OPT_CB) {
        s->armed = 0; /* once, as OBI deletes its sk storage entry */
        otel_tcp_extended_option_t opt = {};
        opt.legacy.kind = k_tcp_option_kind_otel;
        __builtin_memcpy(opt.legacy.trace_id, s->trace_id, 16);
        __builtin_memcpy(opt.legacy.span_id, s->span_id, 8);
        long ret;
        if (s->flags & 1) {
            opt.legacy.len = k_tcp_option_otel_legacy_len;
            ret = bpf_store_hdr_opt(skops, &opt.legacy, sizeof(opt.legacy), 0);
        } else {
            opt.legacy.len = k_tcp_option_otel_extended_len;
            opt.flags = s->flags & 3;
            ret = bpf_store_hdr_opt(skops, &opt, sizeof(opt), 0);
        }
        if (ret == 0) {
            u64 *count = written.lookup(&zero);
            if (count)
                __sync_fetch_and_add(count, 1);
        }
    }
    return 1;
}
"""


class ObiStyleWriter:
    """OBI's way of writing the option, on the sockets of one cgroup (a test node's),
    through a BPF link (gone with the test process)."""

    def __init__(self, cgroup: str) -> None:
        from bcc import BPF

        from otelbpf.sources.bpfsys import link_cgroup

        self.bpf = BPF(text=WRITER.encode())
        fn = self.bpf.load_func(b"obi_style_writer", BPF.SOCK_OPS)
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.link = link_cgroup(fn.fd, fd)
        finally:
            os.close(fd)

    def schedule(self, trace_id: bytes, span_id: bytes, flags: int) -> None:
        """The next header built on a socket of the cgroup carries these ids."""
        table = self.bpf[b"next_request"]
        leaf = table.Leaf()
        ctypes.memmove(ctypes.addressof(leaf.trace_id), trace_id, 16)
        ctypes.memmove(ctypes.addressof(leaf.span_id), span_id, 8)
        leaf.flags = flags
        leaf.armed = 1
        table[ctypes.c_int(0)] = leaf

    @property
    def written(self) -> int:
        return int(self.bpf[b"written"][ctypes.c_int(0)].value)

    def close(self) -> None:
        os.close(self.link)
        self.bpf.cleanup()
