"""The image's build context holds every file its build reads, with no container engine.

deploy/Dockerfile copies the repository root, filtered by .dockerignore, and runs
`pip install /src`. A source that .dockerignore leaves out breaks every image built
after it (the native unwinder's C source once did, unseen for weeks): read
.dockerignore as the builders do (tests/dockerignore.py) and setup.py/pyproject.toml
as the package build does, and check that every file the build needs gets in.
"""

from __future__ import annotations

import re
import runpy
import subprocess
import tomllib
from pathlib import Path

import pytest
from dockerignore import build_context, compile_pattern, excluded, read_patterns
from setuptools import find_packages

from conftest import ROOT
from otelbpf import bundled

DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def tracked_files() -> list[str]:
    """What a fresh clone holds: the files git tracks."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f]


def setup_module_namespace() -> dict:
    """setup.py's functions, without running setup() (the build runs it as __main__)."""
    return runpy.run_path(str(ROOT / "setup.py"), run_name="setup_inspect")


def package_files() -> set[str]:
    """What setuptools packs: every module of the packages pyproject.toml finds, and their package data."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tool = config["tool"]["setuptools"]
    packages = find_packages(str(ROOT), include=tool["packages"]["find"]["include"], exclude=tool["packages"]["find"].get("exclude", ()))
    needed = {config["project"]["readme"], "pyproject.toml", "setup.py"}
    data = tool.get("package-data", {})
    for package in packages:
        folder = ROOT / package.replace(".", "/")
        needed |= {str(p.relative_to(ROOT)) for p in folder.glob("*.py")}
        for glob in data.get("*", []) + data.get(package, []):
            needed |= {str(p.relative_to(ROOT)) for p in folder.glob(glob)}
    return needed


def dockerfile_copies() -> set[str]:
    """The build-context paths the Dockerfile's COPY lines name (not those from a stage)."""
    paths: set[str] = set()
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        sources = [w for w in words[1:-1] if not w.startswith("--")]
        paths |= {s.rstrip("/") for s in sources if s != "."}
    return paths


def test_the_context_holds_every_source_the_package_build_compiles():
    namespace = setup_module_namespace()
    tracked = tracked_files()
    context = build_context(ROOT, tracked)
    sources = set(namespace["extension_sources"]())
    assert "otelbpf/profiles/native/_dwunwind.c" in sources  # the one that was once left out
    assert sources <= set(tracked), sorted(sources - set(tracked))
    assert not sources - context, f".dockerignore leaves out what setup.py compiles: {sorted(sources - context)}"


def test_the_context_holds_every_module_and_package_data_file():
    context = build_context(ROOT, tracked_files())
    needed = package_files()
    assert "otelbpf/profiles/flamegraph.html" in needed and "protocols/http1/parse.pxd" in needed
    assert not needed - context, f".dockerignore leaves out package files: {sorted(needed - context)}"


def test_the_context_holds_what_setup_installs_beside_the_package():
    """bpf/*.c and the demo's services go into the wheel (data_files): the image finds them there."""
    context = build_context(ROOT, tracked_files())
    files = {f for _folder, names in setup_module_namespace()["data_files"]() for f in names}
    assert "bpf/capture.c" in files and "examples/http_backend.py" in files
    assert not files - context, sorted(files - context)


def test_every_probe_source_that_capture_c_includes_is_installed():
    data = dict(setup_module_namespace()["data_files"]())
    installed = {Path(f).name for f in data["share/otelbpf/bpf"]}
    included = set(re.findall(r'#include "([^"]+)"', "\n".join(p.read_text() for p in (ROOT / "bpf").iterdir())))
    assert "capture.c" in installed and included <= installed, sorted(included - installed)


def test_the_wheel_ships_the_services_the_demo_needs():
    data = dict(setup_module_namespace()["data_files"]())
    assert sorted(Path(f).name for f in data["share/otelbpf/examples"]) == sorted(bundled.DEMO_SERVICES)
    assert setup_module_namespace()["DEMO_SERVICES"] == list(bundled.DEMO_SERVICES)


def test_the_context_holds_what_the_dockerfile_copies():
    tracked = tracked_files()
    context = build_context(ROOT, tracked)
    for path in dockerfile_copies():
        under = [f for f in tracked if f == path or f.startswith(path + "/")]
        assert under, f"the Dockerfile copies {path}, which the repository does not have"
        assert set(under) <= context, f".dockerignore leaves out {sorted(set(under) - context)[:5]}, which the Dockerfile copies"


def test_the_context_leaves_out_tests_benchmarks_and_build_outputs():
    patterns = read_patterns(ROOT / ".dockerignore")
    for path in (".venv/bin/python", "tests/test_demo.py", "bench/nginx_wrk.py", "protocols/http1/tests/test_parse.py",
                 "otelbpf/pipeline.c", "otelbpf/pipeline.cpython-311-x86_64-linux-gnu.so", "build/cython/x.c",
                 "otelbpf/__pycache__/x.pyc"):  # fmt: skip
        assert excluded(path, patterns), path


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [  # cases from moby's patternmatcher tests
        ("**", "file", True),
        ("**/", "file", True),
        ("**/", "dir/file", True),
        ("**/file", "file", True),
        ("**/file", "dir/file", True),
        ("**/file", "dir/dir/file", True),
        ("dir/**", "dir/file", True),
        ("dir/**/file", "dir/file", True),
        ("dir/**/file", "dir/dir1/dir2/file", True),
        ("**/*.c", "a/b/c.c", True),
        ("**/*.c", "a.c", True),
        ("*.c", "a/b.c", False),
        ("bpf/*.c", "bpf/capture.c", True),
        ("bpf/*.c", "bpf/sub/capture.c", False),
        ("a?c", "abc", True),
        ("a?c", "a/c", False),
        ("abc.def", "abcxdef", False),
        ("a\\*b", "a*b", True),
        ("a\\*b", "axb", False),
    ],
)
def test_patterns_match_as_the_builders_match(pattern, path, matches):
    assert bool(compile_pattern(pattern).match(path)) is matches


def test_the_last_matching_pattern_decides_and_folders_cover_their_files(tmp_path):
    (tmp_path / ".dockerignore").write_text("*\n!src\n**/*.c\n!src/keep.c\nsrc/tests\n")
    files = ["README", "src/a.py", "src/a.c", "src/keep.c", "src/tests/t.py", "src/sub/b.c"]
    assert build_context(tmp_path, files) == {"src/a.py", "src/keep.c"}
