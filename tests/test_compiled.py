"""The compiled hot path is built, current, and the code that runs.

pyproject.toml ``[tool.otelbpf] compiled`` lists the modules Cython compiles (setup.py).
Each must import as its extension (``.so``), built after its last source change, or
this test fails: under CI always; elsewhere too, unless OTELBPF_ALLOW_PURE=1 says the
pure-Python modules are wanted (then it skips, saying why). Build with
``scripts/install.sh`` (``make install``) or ``.venv/bin/pip install -e .``.

The equivalence tests feed the same inputs to the compiled module and to its ``.py``
loaded by path (never the extension) and compare the outputs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def compiled_modules() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["otelbpf"]["compiled"])


def source_of(name: str) -> Path:
    return ROOT / (name.replace(".", "/") + ".py")


def load_pure(name: str):
    """The module's ``.py`` source, executed as plain Python under another name."""
    spec = importlib.util.spec_from_file_location(name.replace(".", "_") + "_pure", source_of(name))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _problem(name: str) -> str | None:
    module = importlib.import_module(name)
    path = Path(getattr(module, "__file__", "") or "")
    if not isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader) or not any(
        path.name.endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES
    ):
        return f"{name} was imported from {path.name or '?'}, not from a compiled extension"
    if getattr(module, "COMPILED", True) is not True:
        return f"{name}: its extension says cython.compiled is False"
    built = path.stat().st_mtime
    for src in (source_of(name), *cimported_pxds(name)):
        if src.exists() and src.stat().st_mtime > built:
            return f"{name}: {path.name} is older than {src.relative_to(ROOT)} (stale build)"
    return None


_CIMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+cimport\b|cimport\s+([\w.]+))", re.MULTILINE)


def cimported_pxds(name: str) -> list[Path]:
    """The module's own .pxd and every project .pxd it cimports, directly or not: a caller
    typed with another module's extension type reads that type's fields at the offsets its
    .pxd declared when the caller was built, so it is stale when that .pxd changed."""
    found: list[Path] = []
    todo = [name]
    while todo:
        pxd = source_of(todo.pop()).with_suffix(".pxd")
        if pxd in found or not pxd.is_file():
            continue
        found.append(pxd)
        for match in _CIMPORT.finditer(pxd.read_text()):
            todo.append(match.group(1) or match.group(2))
    return found


def test_staleness_follows_cimported_pxds():
    assert ROOT / "otelbpf/core/identity.pxd" in cimported_pxds("otelbpf.pipeline")  # via association.pxd too
    assert ROOT / "protocols/http1/types.pxd" in cimported_pxds("protocols.http1.stitch")  # via parse.pxd


# -- every attribute a compiled class sets is declared --------------------------------

_CDEF_CLASS = re.compile(r"^cdef class (\w+)(?:\((\w+)\))?:")
_FIELD = re.compile(r"^    cdef (?!(?:inline |void |.*\())([^#]+?)\s*$")


def _pxd_classes(pxd: Path) -> dict[str, tuple[set[str], bool, str | None]]:
    """cdef classes of a .pxd: (declared attributes, keeps a __dict__, base class)."""
    classes: dict[str, tuple[set[str], bool, str | None]] = {}
    current = None
    for line in pxd.read_text().splitlines():
        match = _CDEF_CLASS.match(line)
        if match:
            current = match.group(1)
            classes[current] = (set(), False, match.group(2))
            continue
        if line and not line[0].isspace() and not line.startswith(("#", "@")):
            current = None
        field = _FIELD.match(line) if current else None
        if field:
            declared, has_dict, base = classes[current]
            names = [part.split()[-1].lstrip("*") for part in field.group(1).split(",")]
            declared.update(names)
            if "__dict__" in names:
                classes[current] = (declared, True, base)
    return classes


def _assigned_on_self(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in ast.walk(cls):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                    names.add(leaf.attr)
    return names


@pytest.mark.parametrize("name", [n for n in compiled_modules() if source_of(n).with_suffix(".pxd").is_file()])
def test_every_attribute_an_extension_type_sets_is_declared(name):
    """A class a .pxd makes an extension type has only the attributes declared there (unless it
    keeps a __dict__): one its .py sets but the .pxd lacks is an AttributeError in the compiled
    build only. Checked from the sources, so that the pure-Python run catches it too."""
    classes = _pxd_classes(source_of(name).with_suffix(".pxd"))
    tree = ast.parse(source_of(name).read_text())
    missing = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in classes:
            continue
        declared, has_dict, base = classes[node.name]
        while base in classes:  # a cdef base declared in the same .pxd
            declared = declared | classes[base][0]
            has_dict = has_dict or classes[base][1]
            base = classes[base][2]
        if has_dict:
            continue
        undeclared = _assigned_on_self(node) - declared
        if undeclared:
            missing[node.name] = sorted(undeclared)
    assert not missing, f"set in {name}.py but not declared in its .pxd: {missing}"


@pytest.mark.parametrize("name", compiled_modules())
def test_compiled_module_is_built_current_and_imported(name):
    problem = _problem(name)
    if problem is None:
        return
    problem += "; rebuild with scripts/install.sh or `.venv/bin/pip install -e .`"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set: {problem}", pytrace=False)
    if os.environ.get("OTELBPF_ALLOW_PURE") == "1":
        pytest.skip(f"OTELBPF_ALLOW_PURE=1: {problem}")
    pytest.fail(f"{problem} (or set OTELBPF_ALLOW_PURE=1 to run the pure-Python modules)", pytrace=False)


def test_the_list_names_existing_sources():
    for name in compiled_modules():
        assert source_of(name).is_file(), name


# -- same inputs, compiled and pure ---------------------------------------------------


def _compiled(name: str):
    problem = _problem(name)
    if problem is not None:
        pytest.skip(f"no current extension to compare ({problem}); test_compiled_module_* fails for it")
    return importlib.import_module(name)


def _ringbuf_tests():
    spec = importlib.util.spec_from_file_location("otelbpf_test_ringbuf", ROOT / "tests" / "test_ringbuf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ringbuf_compiled_and_pure_drain_the_same_records(seed):
    compiled = _compiled("otelbpf.sources.ringbuf")
    pure = load_pure("otelbpf.sources.ringbuf")
    assert compiled.COMPILED and not pure.COMPILED
    run_fake = _ringbuf_tests().run_fake
    expected_c, drained_c = run_fake(compiled, seed)
    expected_p, drained_p = run_fake(pure, seed)
    assert expected_c == expected_p
    assert drained_c == drained_p == expected_c


def _random_records(rng, layout, count: int) -> list[bytes]:
    """Event records as the probes write them, mostly well-formed: stream data (its payload
    sometimes shorter than its header says), every other kind with random bytes after the
    header, an unknown kind, and records too short for a header."""
    kinds = [layout.EV_DATA] * 6 + [layout.EV_CONN_OPEN, layout.EV_CONN_CLOSE, layout.EV_CONN_PEER,
                                    layout.EV_PROC_EXIT, layout.EV_PROC_START, layout.EV_CALL,
                                    layout.EV_DATAGRAM, 99]  # fmt: skip
    records = []
    for _ in range(count):
        if rng.random() < 0.05:
            records.append(bytes(rng.randrange(256) for _ in range(rng.randrange(layout.HEADER.size))))
            continue
        kind = rng.choice(kinds)
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        captured = len(payload) + (rng.choice((0, 0, 0, 5)) if kind == layout.EV_DATA else 0)
        header = layout.HEADER.pack(
            rng.randrange(1 << 40), rng.randrange(1 << 20), rng.randrange(1 << 22), rng.randrange(1 << 22),
            rng.randrange(-1, 1000), kind, rng.randrange(2), rng.randrange(8), rng.randrange(3),
            len(payload) + rng.randrange(5000), captured, rng.randrange(1 << 30),
        )  # fmt: skip
        records.append(header + payload)
    return records


def test_records_decoded_in_the_ring_are_the_records_decoded_from_bytes():
    """RingBufReader.drain_decoded (compiled: each record decoded where it lies in the ring's
    memory, no bytes copy of it) gives the events, and the malformed count, that the pure
    decoder gives for the same records as bytes: across the ring's wrap, every kind."""
    import random

    ringbuf = _compiled("otelbpf.sources.ringbuf")
    compiled = _compiled("otelbpf.sources.ebpf_layout")
    pure = load_pure("otelbpf.sources.ebpf_layout")
    fake_ring = _ringbuf_tests().FakeRing
    import mmap

    rng = random.Random(11)
    ring = fake_ring(mmap.PAGESIZE)
    reader = ringbuf.RingBufReader(ring.fd, data_size=mmap.PAGESIZE, release_bytes=512)
    in_ring, from_bytes = compiled.RecordDecoder(123), pure.RecordDecoder(123)
    wrapped = 0
    try:
        for _ in range(80):
            records = _random_records(rng, pure, rng.randrange(1, 8))
            for record in records:
                wrapped += ring.prod % mmap.PAGESIZE + len(record) + 8 > mmap.PAGESIZE
                ring.reserve(record)
            got = reader.drain_decoded(in_ring)
            assert repr(got) == repr(from_bytes.decode(records)), records
            assert in_ring.malformed == from_bytes.malformed
            assert ring.cons == ring.prod
    finally:
        reader.close()
        ring.close()
    assert wrapped > 5, "the records never crossed the ring's end"
    assert from_bytes.malformed > 0


def test_pure_modules_run_without_cython_installed():
    """Where Cython is absent (``import cython`` fails), the sources still import and run."""
    code = (
        "import sys, importlib.util\n"
        "sys.modules['cython'] = None\n"
        "for name, path in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    spec = importlib.util.spec_from_file_location(name + '_pure', path)\n"
        "    m = importlib.util.module_from_spec(spec)\n"
        "    sys.modules[spec.name] = m  # dataclasses look their module up there\n"
        "    spec.loader.exec_module(m)\n"
        "    assert getattr(m, 'COMPILED', False) is False, name\n"
        "print('ok')\n"
    )
    args = [x for name in compiled_modules() for x in (name, str(source_of(name)))]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _outcome(fn):
    try:
        return ("ok", repr(fn()))
    except Exception as exc:  # noqa: BLE001 - the same exception is part of the same behaviour
        return ("raised", type(exc).__name__)


def test_ebpf_layout_compiled_and_pure_decode_the_same_events():
    name = "otelbpf.sources.ebpf_layout"
    if name not in compiled_modules():
        pytest.skip(f"{name} is not in [tool.otelbpf] compiled")
    compiled = _compiled(name)
    pure = load_pure(name)
    import random

    rng = random.Random(5)
    size = pure.HEADER.size + 96
    for _ in range(3000):
        # small byte values so that kinds, directions and lengths are often valid
        raw = bytes(rng.choice((0, 0, 1, 2, 3, 4, 5, 10, 127)) for _ in range(rng.randrange(size)))
        results = []
        for module in (compiled, pure):
            decoder = module.RecordDecoder(123)
            results.append((_outcome(lambda: decoder.decode([raw])), decoder.malformed))
        assert results[0] == results[1], raw


def test_the_install_stamp_covers_every_compiled_source():
    """`make install` rebuilds when a compiled source changes: its stamp hashes every file
    setup.py compiles (the fast path's .pyx once was not, and an edit there kept the old
    extension with "venv up to date")."""
    import runpy

    listed = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh"), "--list-compiled-sources"], capture_output=True, text=True, check=True
    ).stdout.split()
    built = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_inspect")["extension_sources"]()
    assert "otelbpf/fastpath/http1.pyx" in listed
    assert set(built) <= set(listed), sorted(set(built) - set(listed))
