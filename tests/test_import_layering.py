"""The package layout keeps its promises: no import cycles in otelbpf/, and the pure parsers
in protocols/ import nothing of the agent.

Every import counts, at module level or inside a function: an import deferred into a
function still ties the two modules together, and a cycle hidden that way is still a
cycle. Deferring an import is fine for start-up cost (BCC, the export layers); it must
not be how two modules that need each other are kept apart.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("otelbpf", "protocols")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict[str, Path]:
    """Every module of the two packages, by dotted name (a .pyx counts as its module)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix in (".py", ".pyx") and "tests" not in path.relative_to(ROOT).parts:
                found[module_name(path)] = path
    return found


def imported_names(path: Path, own: str) -> set[str]:
    """Dotted names a module imports, anywhere in it (the .pyx/.pxd cimports too)."""
    text = path.read_text()
    names: set[str] = set()
    if path.suffix == ".pyx" or path.with_suffix(".pxd").exists():
        for line in (text + "\n" + _pxd_text(path)).splitlines():
            words = line.split()
            if len(words) >= 4 and words[0] == "from" and words[2] == "cimport":
                names.add(words[1])
                names.update(f"{words[1]}.{name.strip(',')}" for name in words[3:])
        if path.suffix == ".pyx":
            text = "\n".join(line for line in text.splitlines() if " cimport " not in line and not line.startswith(("DEF ", "cdef ", "cpdef ")))
            return names | _python_imports(text, own, tolerant=True)
    return names | _python_imports(text, own)


def _pxd_text(path: Path) -> str:
    pxd = path.with_suffix(".pxd")
    return pxd.read_text() if pxd.exists() else ""


def _python_imports(text: str, own: str, tolerant: bool = False) -> set[str]:
    names: set[str] = set()
    if tolerant:  # Cython: read the import lines only
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")):
                try:
                    tree = ast.parse(stripped)
                except SyntaxError:
                    continue
                names |= _from_tree(tree, own)
        return names
    return _from_tree(ast.parse(text), own)


def _from_tree(tree: ast.AST, own: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = own.split(".")[: len(own.split(".")) - node.level]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of these packages it imports (a name resolves to the
    longest known module it starts with)."""
    modules = source_files()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_names(path, name):
            parts = imported.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in modules:
                    targets.add(candidate)
                    break
        # a package's __init__ runs before its modules anyway: no edge to an ancestor
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that import each other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_graph_sees_the_imports_it_must():
    """The reader itself: known edges of several import forms are found (else the cycle
    test below could pass by seeing nothing)."""
    graph = import_graph()
    assert "otelbpf.core.association" in graph["otelbpf.pipeline"]  # from x import y
    assert "otelbpf.cli.doctor" in graph["otelbpf.cli.main"]  # from package import module
    assert "otelbpf.core.events" in graph["otelbpf.core.connections"]  # a .pxd cimport
    assert "protocols.http1.stitch" in graph["otelbpf.fastpath.http1"]  # a .pyx import
    assert "otelbpf.runtime.agent" in graph["otelbpf.cli.main"]  # inside a function


def test_no_import_cycles():
    cycles = strongly_connected(import_graph())
    assert not cycles, "modules that import each other (move the shared piece down):\n" + "\n".join(
        " <-> ".join(group) for group in cycles
    )


def test_no_cycles_between_the_agents_packages():
    """One level up: otelbpf's packages (core, host, sources, semantics, ...) import each
    other one way only, so each can be read knowing only those below it."""

    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "otelbpf" and len(parts) > 2 else module

    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        if module.startswith("otelbpf."):
            packages.setdefault(package(module), set()).update(
                package(t) for t in targets if t.startswith("otelbpf.") and package(t) != package(module)
            )
    cycles = strongly_connected(packages)
    assert not cycles, "packages that import each other:\n" + "\n".join(" <-> ".join(group) for group in cycles)


def test_the_pure_parsers_import_nothing_of_the_agent():
    """protocols/ is sans-IO and knows nothing of eBPF, OTel or the pipeline."""
    leaks = {
        module: sorted(t for t in targets if t.startswith("otelbpf"))
        for module, targets in import_graph().items()
        if module.startswith("protocols")
    }
    assert not {m: t for m, t in leaks.items() if t}


#: The modules every event goes through: they read the capabilities that protocols/base.py's
#: Detector and Exchange, and semantics/common.py's CallSemantics, declare with defaults.
PER_EVENT_MODULES = ("otelbpf/pipeline.py", "otelbpf/registry.py", "otelbpf/core/connections.py", "otelbpf/core/association.py")


def _calls(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
    ]


def test_no_capability_probing_on_the_per_event_path():
    """Optional capabilities are declared with defaults (protocols/base.py, semantics/common.py),
    not probed for with hasattr/getattr by the modules every event goes through."""
    found = [
        f"{module}:{node.lineno}"
        for module in PER_EVENT_MODULES
        for node in ast.walk(ast.parse((ROOT / module).read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and (node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3))  # a default: a probe
    ]  # fmt: skip
    assert not found, "declare the capability with a default instead:\n" + "\n".join(found)


def test_pipelines_are_built_in_one_place():
    """`run`, `demo` and `replay` build their pipeline through otelbpf/assembly.py: nothing else
    in the agent constructs one, so the three cannot drift apart."""
    builders = [
        call
        for module, path in source_files().items()
        if module.startswith("otelbpf") and module not in ("otelbpf.assembly", "otelbpf.pipeline") and path.suffix == ".py"
        for call in _calls(path, {"Pipeline"})
    ]
    assert not builders, "build it with otelbpf.assembly.build_pipeline:\n" + "\n".join(builders)


def test_every_protocol_folder_has_the_files_the_guide_promises():
    """DEVELOPERS.md "Adding a protocol": detect.py, stitch.py, types.py and a fuzz test in
    every registered protocol's folder (the parser is named for what it parses)."""
    from otelbpf.registry import default_registry

    for entry in default_registry().protocols:
        folder = ROOT / "protocols" / entry.id
        missing = [name for name in ("__init__.py", "detect.py", "stitch.py", "types.py", "tests/test_fuzz.py")
                   if not (folder / name).is_file()]  # fmt: skip
        assert not missing, f"protocols/{entry.id} lacks {missing}"
        detect = importlib.import_module(f"protocols.{entry.id}.detect")
        own = [c for c in vars(detect).values() if isinstance(c, type) and c.__module__ == detect.__name__]
        assert any(isinstance(entry.detector, c) for c in own), f"the {entry.id} detector is not from protocols/{entry.id}/detect.py"


#: Module names that repeat across packages, each the same concept at another layer. A new
#: repeat fails until it is added here with its reason, or renamed to say what is inside.
SAME_CONCEPT_AT_ANOTHER_LAYER = {
    "types": "a protocol's messages and exchange (protocols/<id>/); profile sample types (profiles/)",
    "detect": "each protocol's detector", "stitch": "each protocol's session",
    "gpu": "GPU probes (sources/), spans (semantics/), metrics (metrics/), profiles (profiles/)",
    "encode": "to OTLP, per signal: spans (export/), metrics (metrics/), profiles (profiles/)",
    "sinks": "where a signal goes: spans (export/), metrics (metrics/)",
    "selfmetrics": "the agent's own counters (core/) and their export (metrics/)",
    "checks": "what a host check found (host/) and the profiles' checks (profiles/)",
    "model": "the plain data a signal is built of: spans (core/), samples (profiles/)",
    "replay": "a capture as a source (sources/pcap/) and as a command (cli/)",
    "wire": "a wire format: protobuf's (otlp/), RTPS's (protocols/rtps/)",
    "http1": "per protocol: span semantics (semantics/), instruments (metrics/)",
    "http2": "per protocol: span semantics, instruments", "rtps": "per protocol: span semantics, instruments",
    "genai": "GenAI span semantics (semantics/), GenAI instruments (metrics/)",
    "export": "sending a signal out: spans (the export/ package), profiles (profiles/export.py)",
}  # fmt: skip


def test_a_module_name_repeats_only_for_the_same_concept_at_another_layer():
    seen: dict[str, list[str]] = {}
    for module in source_files():
        name = module.rsplit(".", 1)[-1]
        if name not in ("__init__", "otelbpf", "protocols"):
            seen.setdefault(name, []).append(module)
    repeats = {name: modules for name, modules in seen.items() if len(modules) > 1}
    unexplained = {name: modules for name, modules in repeats.items() if name not in SAME_CONCEPT_AT_ANOTHER_LAYER}
    assert not unexplained, f"rename, or say why it is the same concept at another layer: {unexplained}"
