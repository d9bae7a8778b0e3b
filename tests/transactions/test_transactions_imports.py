"""The import structure of ``slmlab.transactions``, read from the source with ``ast`` (every import
statement, at module level or inside a function): no cycle among its modules, imports pointing down
the layers, and none of the packages the library must not depend on. Cycles and ``__main__`` blocks
are checked for the whole tree by ``test_architecture.py``.

Layers, bottom to top: ``_deps`` (the extra's check), ``data/``, ``embedding``, ``model``, ``heads/`` and
``generate``, ``evaluation/`` and ``run_folder``, ``training``, ``demo/``, ``pipeline`` (the command's entry points),
then the package ``__init__``. A module may import its own wing (cycles
excepted) and any lower layer. The import of a module's parent packages (which Python runs first) is
not an edge: only what the statement names is.
"""

from __future__ import annotations

import pytest

from import_graph import SRC, import_graph

ROOT = SRC / "transactions"
PACKAGE = "slmlab.transactions"
LAYER = {"_deps": -1, "data": 0, "embedding": 1, "model": 2, "heads": 3, "generate": 3, "evaluation": 4,
         "run_folder": 4, "training": 5, "demo": 6, "pipeline": 7, "": 9}
FORBIDDEN = ("slmlab.commands", "slmlab.bench", "slmlab.serve", "slmlab.export", "slmlab.cli")
ALLOWED_SLMLAB = {"outputs", "layers", "data", "generation", "models", "evaluate", "train", "transactions"}

GRAPH = {name: targets for name, targets in import_graph().items() if name.startswith(PACKAGE)}
MODULES = {name for name in GRAPH} | {PACKAGE}


def wing(name: str) -> str:
    rest = name[len(PACKAGE) + 1:] if name != PACKAGE else ""
    return rest.split(".")[0]


def test_the_package_is_laid_out_in_wings():
    wings = {wing(name) for name in MODULES}
    assert wings <= set(LAYER), f"modules without a layer: {wings - set(LAYER)}"
    assert {"slmlab.transactions.model", "slmlab.transactions.embedding", "slmlab.transactions.training"} <= MODULES
    for sub in ("data", "heads", "evaluation", "demo"):
        assert (ROOT / sub / "__init__.py").is_file()


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_imports_point_down_and_avoid_the_forbidden_packages(name):
    """Within the package, wing by wing (cycles and ``__main__`` blocks: ``test_architecture.py``)."""
    here = LAYER[wing(name)]
    for target, line in GRAPH[name].items():
        where = f"{name}:{line} imports {target}"
        assert not target.startswith(FORBIDDEN), where
        if target == "slmlab":
            continue  # the package root (``__version__``)
        if not target.startswith(PACKAGE):
            assert target.split(".")[1] in ALLOWED_SLMLAB, where
        elif wing(target) != wing(name):
            assert LAYER[wing(target)] < here, f"{where}, a layer up (or across)"


def test_the_graph_sees_function_level_imports():
    """A self-check: the reader finds imports inside functions (they count for cycles too)."""
    targets = set(GRAPH["slmlab.transactions.pipeline"])
    assert "slmlab.transactions.demo.app" in targets and "slmlab.transactions.training" in targets
