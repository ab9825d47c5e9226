"""TLS plaintext without the kernel: which files are probed (once each), how the
connection table keeps ciphertext and plaintext of one socket apart, and the
``https`` scheme of spans built from plaintext. The kernel side is exercised
by tests/test_ebpf_tls.py."""

from __future__ import annotations

import os
import shutil

import pytest

from otelbpf.core.events import Source
from otelbpf.semantics.common import url_scheme
from otelbpf.sources import tls
from protocols.base import ExchangeCompleted
from tests.test_connections import GET, IN, OUT, data, opened, table

LIBSSL = next(iter(tls.system_libssl_paths()), None)
needs_libssl = pytest.mark.skipif(LIBSSL is None, reason="no libssl in this host's linker cache")


class FakeBpf:
    """Records what would be attached (the BCC calls TlsProbes makes)."""

    def __init__(self, fail: set[str] = frozenset()) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.pids: set[int] = set()
        self.attached: set[tuple[str, int, int, str]] = set()
        self.fail = fail

    def attach_uprobe(self, name, addr, fn_name, pid):
        if fn_name in self.fail:
            raise Exception("cannot attach uprobe")
        self.calls.append(("entry", os.path.basename(name), fn_name))
        self.pids.add(pid)
        self.attached.add((name, addr, pid, "entry"))

    def attach_uretprobe(self, name, addr, fn_name, pid):
        self.calls.append(("ret", os.path.basename(name), fn_name))
        self.pids.add(pid)
        self.attached.add((name, addr, pid, "ret"))

    def detach_uprobe(self, name, addr, pid):
        self.attached.remove((name, addr, pid, "entry"))

    def detach_uretprobe(self, name, addr, pid):
        self.attached.remove((name, addr, pid, "ret"))


# -- which files ----------------------------------------------------------------


@needs_libssl
def test_the_host_libssl_is_probed_once_with_returns_before_entries():
    bpf = FakeBpf()
    probes = tls.TlsProbes(bpf)
    found = probes.attach_system()
    assert [library.path for library in found] == [LIBSSL]
    assert {"SSL_read", "SSL_write"} <= set(found[0].functions)
    entries = [fn for kind, _, fn in bpf.calls if kind == "entry"]
    assert "tls_read_enter" in entries and "tls_write_enter" in entries and "tls_free_enter" in entries
    # each return probe is attached before its entry probe; SSL_free has no return probe
    for index, (kind, _, fn) in enumerate(bpf.calls):
        if kind == "entry" and fn != "tls_free_enter":
            assert bpf.calls[index - 1][0] == "ret"
    before = len(bpf.calls)
    assert probes.attach_system() == [found[0]] and len(bpf.calls) == before  # the same inode: nothing more
    assert probes.scan(os.getpid()) in ([], [found[0]]) and len(bpf.calls) == before
    assert bpf.pids == {-1}  # host-wide: once per file, for every process


@needs_libssl
def test_per_process_probes_are_attached_for_that_process_only_and_detached_when_it_goes():
    bpf = FakeBpf()
    probes = tls.TlsProbes(bpf, host_wide=False)
    assert probes.attach_system() == [] and bpf.calls == []  # nothing for processes not traced
    pid = os.getpid()
    library = probes._probe_file(LIBSSL, LIBSSL, pid)
    assert library is not None and bpf.pids == {pid}
    assert probes._probe_file(LIBSSL, LIBSSL, pid) is library and len(bpf.attached) == len(bpf.calls)
    probes.forget(pid)
    assert bpf.attached == set()
    assert probes._probe_file(LIBSSL, LIBSSL, pid) is not None  # a new process with the same pid: again


@needs_libssl
def test_a_copy_of_libssl_elsewhere_is_probed_for_itself_keyed_by_inode(tmp_path):
    copy = tmp_path / "libssl.so.3"
    shutil.copy(LIBSSL, copy)
    bpf = FakeBpf()
    probes = tls.TlsProbes(bpf)
    library = probes._probe_file(str(copy), str(copy), -1)
    assert library is not None and library.flavour == "OpenSSL 3"
    assert {name for _, name, _ in bpf.calls} == {"libssl.so.3"}
    assert probes._probe_file(str(copy), "/elsewhere/libssl.so.3", -1) is library  # keyed by inode, not by name


@needs_libssl
def test_a_library_whose_probes_fail_to_attach_is_not_reported_as_covered():
    probes = tls.TlsProbes(FakeBpf(fail={"tls_read_enter", "tls_write_enter", "tls_read_ex_enter", "tls_write_ex_enter"}))
    assert probes._probe_file(LIBSSL, LIBSSL, -1) is None


def test_files_without_openssl_exports_are_not_probed(tmp_path):
    plain = tmp_path / "libplain.so"
    plain.write_bytes(b"\x7fELF not really")
    assert not tls.candidate(str(plain), str(plain))
    hinted = tmp_path / "libhint.so"
    hinted.write_bytes(b"mentions SSL_write but is no ELF")
    assert tls.candidate(str(hinted), str(hinted))
    probes = tls.TlsProbes(FakeBpf())
    assert probes._probe_file(str(hinted), str(hinted), -1) is None  # the .dynsym decides
    assert probes._probe_file(str(tmp_path / "gone.so"), "gone.so", -1) is None
    assert tls.candidate("/nonexistent/libssl.so.3", "/usr/lib/libssl.so.3")  # by name: parsed next


def test_flavour_names_the_library():
    assert tls.flavour("/usr/lib/x86_64-linux-gnu/libssl.so.3", {}) == "OpenSSL 3"
    assert tls.flavour("/opt/lib/libssl.so.1.1", {}) == "OpenSSL 1.1"
    assert tls.flavour("/srv/bin/node", {"SSL_read": 1}) == "OpenSSL exported by node (no _ex functions)"


# -- ciphertext and plaintext of one socket --------------------------------------


def test_plaintext_mutes_the_ciphertext_and_is_parsed_on_its_own():
    connections, recorder, counters = table()
    connections.open(opened(1))
    connections.data(data(1, b"\x16\x03\x01\x00\x05hello", ts=1))  # ClientHello-like ciphertext
    connections.data(data(1, GET, ts=2, source=Source.TLS))
    assert recorder.muted == [(1, Source.SOCKET)]  # the kernel stops copying ciphertext, not plaintext
    assert connections.get(1).unrecognized and connections.get(1).session is None
    assert counters.get("otelbpf.tls.connections") == 1
    connections.data(data(1, b"\x17\x03\x03\x00\x20" + b"\x00" * 32, OUT, ts=3))  # more ciphertext: skipped
    connections.data(data(1, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", OUT, ts=4, source=Source.TLS))
    completed = [item for _, _, out in recorder.events for item in out if isinstance(item, ExchangeCompleted)]
    assert len(completed) == 1 and len(recorder.started()) == 1
    assert connections.get(1, Source.TLS).protocol == "http1"


def test_ciphertext_that_a_detector_took_for_a_protocol_is_ended_when_plaintext_shows():
    connections, recorder, _ = table()
    connections.open(opened(1))
    connections.data(data(1, GET, ts=1))  # looks like HTTP on the socket: a session starts
    assert connections.get(1).protocol == "http1"
    connections.data(data(1, GET, ts=2, source=Source.TLS))
    socket_entry = connections.get(1)
    assert socket_entry.session is None and socket_entry.unrecognized
    assert recorder.muted == [(1, Source.SOCKET)]


def test_spans_from_plaintext_say_https():
    connections, _, _ = table()
    connections.open(opened(1))
    connections.data(data(1, GET, source=Source.TLS))
    assert url_scheme(connections.get(1, Source.TLS)) == "https"
    connections.open(opened(2))
    connections.data(data(2, GET))
    assert url_scheme(connections.get(2)) == "http"
