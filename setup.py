"""Builds the compiled hot path: Cython compiles the pure-Python modules listed in
pyproject.toml under ``[tool.otelbpf] compiled`` (the one list; add a module there).

Each listed ``.py`` stays the single source of truth: it runs as plain Python where
no extension was built, and the extension (``.so`` beside it, preferred by import)
where one was. Types for Cython come from ``@cython.*`` decorators / ``cython.declare``
in the module, or from an augmenting ``.pxd`` of the same name beside it.

``pip install -e .`` (scripts/install.sh) builds the extensions in place. Where Cython
or a C compiler is missing the build warns and installs the pure modules, unless CI
is set or OTELBPF_REQUIRE_COMPILED=1, where it fails. tests/test_compiled.py fails
when the extensions are missing, stale or not the modules imported.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent

# Directives for every compiled module. annotation_typing=False: plain annotations
# (``data: bytes``, ``n: int``) stay hints, as in the pure module, instead of becoming
# exact type checks that only the compiled build would enforce. C types are opted into
# explicitly (@cython.locals, cython.declare, a .pxd). nonecheck=True: a variable typed
# with an extension type may hold None (a field read on it then raises AttributeError, as
# in the pure module) instead of reading through a NULL struct; one pointer comparison.
DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,
    "embedsignature": True,
    "nonecheck": True,
}


def compiled_modules() -> list[str]:
    with open(HERE / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["otelbpf"]["compiled"])


def fast_path_modules() -> list[str]:
    """The compiled fast path's modules (``[tool.otelbpf] fast``): ``.pyx`` sources."""
    with open(HERE / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["otelbpf"].get("fast", []))


def _required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("OTELBPF_REQUIRE_COMPILED") == "1"


def extensions() -> list[Extension]:
    required = _required()
    try:
        from Cython.Build import cythonize
    except ImportError:
        if required:
            raise
        print("otelbpf: Cython is not installed: installing the pure-Python modules only", file=sys.stderr)
        return []
    exts = [
        # optional: a C compile failure warns (setuptools) instead of failing the install,
        # except where the compiled path is required (CI, OTELBPF_REQUIRE_COMPILED=1)
        Extension(name, [name.replace(".", "/") + ".py"], optional=not required)
        for name in compiled_modules()
    ] + [
        Extension(name, [name.replace(".", "/") + ".pyx"], optional=not required)
        for name in fast_path_modules()
    ]
    try:
        return cythonize(exts, build_dir="build/cython", compiler_directives=DIRECTIVES, quiet=True)
    except Exception as exc:  # Cython.Compiler.Errors.CompileError
        if required:
            raise
        print(f"otelbpf: Cython failed ({exc}): installing the pure-Python modules only", file=sys.stderr)
        return []


def native_extensions() -> list[Extension]:
    """The native stack unwinder (profiles), plain C over elfutils' libdw; optional
    like the Cython modules unless the compiled path is required."""
    return [
        Extension(
            "otelbpf.profiles.native._dwunwind",
            ["otelbpf/profiles/native/_dwunwind.c"],
            libraries=["dw", "elf", "stdc++"],
            extra_compile_args=["-O2", "-std=gnu11"],
            optional=not _required(),
        )
    ]


def extension_sources() -> list[str]:
    """Every hand-written source an extension is built from, as the build reads it (the
    compiled modules' .py and .pxd, the fast path's .pyx, the native unwinder's .c):
    what the image's build context must hold (tests/test_image_context.py)."""
    sources = []
    for name in compiled_modules():
        stem = name.replace(".", "/")
        sources += [stem + ".py"] + ([stem + ".pxd"] if (HERE / (stem + ".pxd")).exists() else [])
    sources += [name.replace(".", "/") + ".pyx" for name in fast_path_modules()]
    for ext in native_extensions():
        sources += ext.sources
    return sources


#: The demo's example services (otelbpf/bundled.py's DEMO_SERVICES).
DEMO_SERVICES = ["http_backend.py", "http_gateway.py", "grpc_service.py", "openai_mock_server.py"]


def data_files() -> list[tuple[str, list[str]]]:
    """Files installed beside the package, under <prefix>/share/otelbpf: the probes' C
    sources (BCC compiles them at start-up) and the demo's services. An installed wheel
    (the image) finds them there from its own location (otelbpf/bundled.py)."""
    probes = sorted(str(p.relative_to(HERE)) for p in (HERE / "bpf").iterdir() if p.suffix in (".c", ".h"))
    return [
        ("share/otelbpf/bpf", probes),
        ("share/otelbpf/examples", [f"examples/{name}" for name in DEMO_SERVICES]),
    ]


if __name__ == "__main__":  # (setuptools' build backend runs this file as __main__)
    setup(ext_modules=extensions() + native_extensions(), data_files=data_files())
