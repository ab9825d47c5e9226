"""Per-record cost of reading the BPF ring buffer: BCC's callback path vs RingBufReader.

Fills a ring buffer from a tracepoint (each getcwd() call submits one record,
BPF_RB_NO_WAKEUP), then times one consume of everything queued, for:

* bcc:      open_ring_buffer(cb) + ring_buffer_consume(), cb = ctypes.string_at + append
            (what otelbpf/sources/ebpf.py did per record)
* compiled: otelbpf.sources.ringbuf.RingBufReader.drain(), the Cython extension
* pure:     the same reader from ringbuf.py, uncompiled
* drain + decode, drain_decoded: what the agent does with them (compiled): each
            record a stream-data event record (struct event_hdr, then the payload),
            copied out and decoded (RecordDecoder.decode of drain()), or decoded where
            it lies in the ring (RingBufReader.drain_decoded: the payload copied once)

Numbers, not asserts. As root: .venv/bin/python bench/ringbuf_drain.py [--size 128]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROGRAM = r"""
BPF_RINGBUF_OUTPUT(events, RB_PAGES);
/* laid out as struct event_hdr (bpf/capture.h): a stream-data record of RECSZ - 48 bytes */
struct rec_t {
    u64 seq; u64 conn_id; u32 tgid; u32 tid; s32 fd; u8 kind; u8 direction; u8 flags; u8 source;
    u32 total_len; u32 captured_len; u64 task_id; u8 data[RECSZ - 48];
};
BPF_PERCPU_ARRAY(scratch, struct rec_t, 1);
BPF_ARRAY(lost, u64, 1);

TRACEPOINT_PROBE(syscalls, sys_enter_getcwd) {
    if ((bpf_get_current_pid_tgid() >> 32) != TGID)
        return 0;
    int zero = 0;
    struct rec_t *r = scratch.lookup(&zero);
    if (!r)
        return 0;
    r->seq++;
    r->kind = 1; /* EV_DATA */
    r->captured_len = RECSZ - 48;
    r->total_len = RECSZ - 48;
    if (events.ringbuf_output(r, RECSZ, BPF_RB_NO_WAKEUP)) {
        u64 *l = lost.lookup(&zero);
        if (l)
            __sync_fetch_and_add(l, 1);
    }
    return 0;
}
"""


def fill(libc, buf, records: int) -> None:
    getcwd = libc.getcwd
    for _ in range(records):
        getcwd(buf, 8192)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=50_000, help="records per round")
    ap.add_argument("--size", type=int, default=128, help="record bytes, the 48-byte event header included (>= 48)")
    ap.add_argument("--ring-mb", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.size < 48:
        ap.error("--size: at least 48 (the event header)")
    from bcc import BPF

    from otelbpf.sources.ebpf_layout import RecordDecoder

    import otelbpf.sources.ringbuf as compiled

    spec = importlib.util.spec_from_file_location("ringbuf_pure", ROOT / "otelbpf/sources/ringbuf.py")
    pure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pure)

    pages = args.ring_mb * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
    # a round must fit in the ring (nothing consumes while it fills)
    args.records = min(args.records, args.ring_mb * 1024 * 1024 // ((args.size + 8 + 7) & ~7) - 1)
    bpf = BPF(
        text=PROGRAM.encode(),
        cflags=[f"-DRB_PAGES={pages}", f"-DRECSZ={args.size}", f"-DTGID={os.getpid()}", "-Wno-macro-redefined"],
    )
    libc = ctypes.CDLL(None)
    buf = ctypes.create_string_buffer(8192)
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    fd = bpf[b"events"].map_fd

    def run_reader(module):
        reader = module.RingBufReader(fd)
        times = []
        try:
            for _ in range(args.rounds):
                fill(libc, buf, args.records)
                t0 = time.perf_counter()
                got = reader.drain()
                times.append(time.perf_counter() - t0)
                assert len(got) == args.records, (len(got), args.records)
        finally:
            reader.close()
        return times

    def run_decoding(fused: bool):
        reader = compiled.RingBufReader(fd)
        decoder = RecordDecoder(0)
        times = []
        try:
            for _ in range(args.rounds):
                fill(libc, buf, args.records)
                t0 = time.perf_counter()
                events = reader.drain_decoded(decoder) if fused else decoder.decode(reader.drain())
                times.append(time.perf_counter() - t0)
                assert len(events) == args.records and not decoder.malformed, (len(events), decoder.malformed)
        finally:
            reader.close()
        return times

    results = {}
    results["compiled" if compiled.COMPILED else "compiled (NOT BUILT: pure)"] = run_reader(compiled)
    results["pure"] = run_reader(pure)
    results["compiled drain + decode"] = run_decoding(fused=False)
    results["compiled drain_decoded"] = run_decoding(fused=True)

    raw: list[bytes] = []

    def on_record(_ctx, data, size):
        raw.append(ctypes.string_at(data, size))
        return 0

    bpf[b"events"].open_ring_buffer(on_record)
    times = []
    for _ in range(args.rounds):
        raw.clear()
        fill(libc, buf, args.records)
        t0 = time.perf_counter()
        bpf.ring_buffer_consume()
        times.append(time.perf_counter() - t0)
        assert len(raw) == args.records, (len(raw), args.records)
    results["bcc callback"] = times
    lost = int(bpf[b"lost"][ctypes.c_int(0)].value)
    bpf.cleanup()

    print(f"{args.records} records of {args.size} B per round, {args.rounds} rounds, ring {args.ring_mb} MiB, lost {lost}")
    print(f"{'path':28} {'ns/record (median)':>20} {'min':>8} {'Mrec/s':>8}")
    for name, ts in results.items():
        med = statistics.median(ts) / args.records * 1e9
        best = min(ts) / args.records * 1e9
        print(f"{name:28} {med:20.0f} {best:8.0f} {1e3 / med:8.2f}")


if __name__ == "__main__":
    main()
