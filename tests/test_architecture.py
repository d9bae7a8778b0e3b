"""The architecture holds: every import in ``src/slmlab`` points down the layers README names, no
module imports itself back through a circle, and README's map lists every subpackage.

The layers are read from README's "Imports point down" line, so the documented order and the tested
one are the same text. Imports inside functions count: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from import_graph import SRC, cycles, import_graph, modules

ROOT = SRC.parents[1]
README = (ROOT / "README.md").read_text()


def readme_layers() -> list[list[str]]:
    """``[["layers", "data", "plots"], ["generation"], ...]`` from README's line
    ``Imports point down: layers, data, plots → generation → ... → cli``, lowest first."""
    match = re.search(r"Imports point down[^:]*:\s*(.+?)\.?\n", README)
    assert match, "README's Architecture section must state the layers: 'Imports point down: a, b → c → ...'"
    return [[name.strip(" `") for name in group.split(",")] for group in match.group(1).split("→")]


def layer_of(module: str, ranks: dict[str, int]) -> tuple[str, int] | None:
    """The top-level part a module belongs to (``slmlab.models.base`` -> ``models``) and its rank;
    None for the package root ``slmlab`` (the public API, above nothing and below nothing)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    assert parts[1] in ranks, f"{module}: '{parts[1]}' is in no layer of README's 'Imports point down' line"
    return parts[1], ranks[parts[1]]


def wrong_arrows(graph, layers) -> list[str]:
    ranks = {name: rank for rank, group in enumerate(layers) for name in group}
    bad = []
    for source, targets in graph.items():
        for target in targets:
            a, b = layer_of(source, ranks), layer_of(target, ranks)
            if a is None or b is None or a[0] == b[0]:
                continue
            if b[1] > a[1]:
                bad.append(f"{source} -> {target} (up: {a[0]} imports {b[0]})")
            elif b[1] == a[1]:
                bad.append(f"{source} -> {target} (sideways: {a[0]} and {b[0]} are peers)")
    return sorted(bad)


def test_every_import_points_down():
    bad = wrong_arrows(import_graph(), readme_layers())
    assert not bad, "imports against README's layers:\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_top_level_part_has_a_layer():
    ranks = {name for group in readme_layers() for name in group}
    parts = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    parts |= {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    assert parts == ranks, f"in src/slmlab but not in a layer: {sorted(parts - ranks)}; stale: {sorted(ranks - parts)}"


def test_no_main_blocks_in_the_library():
    allowed = {SRC / "cli.py"}
    found = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
             if p not in allowed and re.search(r"^if __name__ == .__main__.:", p.read_text(), re.M)]
    assert not found, f"library modules with a __main__ block (put an entry point in commands/ instead): {found}"


def architecture_block() -> str:
    section = README.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_readme_map_lists_every_subpackage():
    """Each top-level part as ``name/`` or ``name.py`` at the start of a line of the map; each deeper
    package (``data/tasks/``, ``transactions/heads/``) by its path; family folders as
    ``models/<family>/``, which covers what is inside them."""
    block = architecture_block()
    missing = []
    for path in sorted(SRC.rglob("__init__.py")):
        rel = path.parent.relative_to(SRC)
        parts = rel.parts
        if not parts or (parts[0] == "models" and len(parts) >= 3):
            continue  # the root; inside a family folder
        if len(parts) == 1:
            ok = re.search(rf"^\s+{re.escape(parts[0])}/", block, re.M) is not None
        elif parts[0] == "models":
            ok = "models/<family>/" in block
        else:
            ok = f"{rel.as_posix()}/" in block or re.search(rf"^\s+{re.escape(parts[-1])}/", block, re.M) is not None
        if not ok:
            missing.append(f"{rel.as_posix()}/")
    for path in sorted(SRC.glob("*.py")):
        if re.search(rf"^\s+{re.escape(path.name)}\s", block, re.M) is None:
            missing.append(path.name)
    assert not missing, f"README's Architecture map does not list: {missing}"


# -- the checks themselves: each must fail on the mistake it exists for ----------------------------


def test_the_checks_catch_their_mistakes():
    layers = [["low"], ["mid", "peer"], ["top"]]
    graph = {"slmlab.low.a": {"slmlab.mid.b"}, "slmlab.mid.b": {"slmlab.low.a"}, "slmlab.top.c": {"slmlab.low.a"},
             "slmlab.mid.d": {"slmlab.peer.e"}}
    assert wrong_arrows(graph, layers) == ["slmlab.low.a -> slmlab.mid.b (up: low imports mid)",
                                           "slmlab.mid.d -> slmlab.peer.e (sideways: mid and peer are peers)"]
    assert cycles(graph) == [["slmlab.low.a", "slmlab.mid.b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_function_level_imports_are_in_the_graph():
    graph = import_graph()
    # slmlab.commands.audit imports the registry only inside audit_command (the CLI stays light)
    assert "slmlab.models.registry" in graph["slmlab.commands.audit"]


def private_imports() -> list[str]:
    """``from slmlab.x import _name``: a private name of another module (a private submodule, such as
    ``commands/_common.py``, may be imported by name: its names are what it shares)."""
    found = []
    mods = modules()
    for name, (path, is_package) in mods.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.split(".")[0] != "slmlab":
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and f"{module}.{alias.name}" not in mods:
                    found.append(f"{name} imports {module}.{alias.name}")
    return sorted(found)


def test_no_private_names_across_modules():
    found = private_imports()
    assert not found, "private names used across modules (make them public or local):\n" + "\n".join(found)


def test_tests_mirror_the_source():
    """Each folder of tests/ is a package of src/slmlab (tests/models/neollm/ <-> models/neollm/), and
    every test module's name is unique across the folders."""
    tests = ROOT / "tests"
    folders = {p.parent.relative_to(tests) for p in tests.rglob("*.py")} - {Path(".")}
    stray = sorted(str(f) for f in folders if not (SRC / f / "__init__.py").is_file())
    assert not stray, f"test folders with no package of the same path in src/slmlab: {stray}"
    names = [p.name for p in tests.rglob("*.py") if p.name != "__init__.py"]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
