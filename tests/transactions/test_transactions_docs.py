"""docs/transactions.md's module table ("Layout") is the package: it names every module under
``src/slmlab/transactions`` (each ``.py`` but the packages' ``__init__``), and every file or folder it
names exists (a path is relative to the package folder, as ``../commands/transactions.py``)."""

from __future__ import annotations

import re
from pathlib import Path

from import_graph import SRC

ROOT = SRC / "transactions"
DOC = SRC.parents[1] / "docs" / "transactions.md"


def layout_paths(doc: str) -> list[str]:
    """The first column of the "## Layout" section's table: one path per row, in order."""
    section = doc.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def layout_mismatch(doc: str, root: Path) -> tuple[list[str], list[str]]:
    """``(modules the table misses, paths it names that do not exist)``."""
    named = layout_paths(doc)
    modules = sorted(path.relative_to(root).as_posix() for path in root.rglob("*.py") if path.name != "__init__.py")
    return [m for m in modules if m not in named], [p for p in named if not (root / p).exists()]


def test_the_layout_table_names_every_module_and_only_real_ones():
    missing, unknown = layout_mismatch(DOC.read_text(), ROOT)
    assert not missing, f"docs/transactions.md's Layout table does not list: {missing}"
    assert not unknown, f"docs/transactions.md's Layout table names what does not exist: {unknown}"
    assert len(layout_paths(DOC.read_text())) == len(set(layout_paths(DOC.read_text()))), "a module listed twice"


def test_the_check_catches_a_missing_and_a_stale_row(tmp_path):
    (tmp_path / "wing").mkdir()
    for name in ("__init__.py", "top.py", "wing/__init__.py", "wing/low.py", "wing/new.py"):
        (tmp_path / name).write_text("")
    doc = ("# x\n\n## Layout\n\n| file | what |\n|---|---|\n| `top.py` | a |\n| `wing/low.py` | b |\n"
           "| `wing/gone.py` | c |\n\n## Next\n\n| `wing/new.py` | outside the section |\n")
    assert layout_paths(doc) == ["top.py", "wing/low.py", "wing/gone.py"]
    assert layout_mismatch(doc, tmp_path) == (["wing/new.py"], ["wing/gone.py"])
