"""Imports a compiled module's source instead of its extension when the source is newer.

setup.py compiles selected pure-Python modules with Cython in place (the
``.so`` beside the ``.py``), and Python prefers the ``.so``. In a working tree,
editing the ``.py`` without rebuilding would then silently run the old code.
This finder, installed once by ``protocols/__init__.py`` (which every otelbpf
module imports first), loads the ``.py`` of an ``otelbpf.*`` or
``protocols.*`` module whose extension is older than its ``.py`` or ``.pxd``,
or of every module when ``OTELBPF_PURE=1`` (to run or profile the pure
code). ``tests/test_compiled.py`` makes sure CI runs the compiled code.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_PACKAGES = ("otelbpf.", "protocols.")
_EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)


class FreshSourceFinder:
    """A meta path finder that prefers a module's ``.py`` over a stale or unwanted extension."""

    def __init__(self, pure: bool) -> None:
        self.pure = pure

    def find_spec(self, name, path, target=None):
        if not name.startswith(_PACKAGES):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        origin = spec.origin if spec is not None else None
        if not origin or not origin.endswith(_EXTENSIONS):
            return None
        source = origin[: origin.index(".", origin.rindex("/"))] + ".py"
        if not os.path.exists(source):
            return None
        if self.pure or _newer(source, origin) or _newer(source[:-3] + ".pxd", origin):
            return importlib.util.spec_from_file_location(name, source)
        return None


def _newer(path: str, than: str) -> bool:
    try:
        return os.stat(path).st_mtime > os.stat(than).st_mtime
    except OSError:
        return False


def install() -> None:
    if not any(isinstance(finder, FreshSourceFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, FreshSourceFinder(os.environ.get("OTELBPF_PURE") == "1"))
