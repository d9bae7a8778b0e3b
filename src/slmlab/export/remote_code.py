"""A model's slmlab source, flattened into one folder that transformers' remote-code loader runs.

``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` imports the module named
in ``config.json``'s ``auto_map`` and copies the files it imports relatively (``from .x import y``,
the only form its loader follows) from the same folder. So the exporter:

1. collects every slmlab module the model's modeling and configuration modules import,
   transitively, wherever the import sits (top level, inside functions, ``TYPE_CHECKING``), read
   with :mod:`ast`;
2. writes each as one top-level file: modules of the family's own package keep their path below it
   (``modeling_pgsm.py``, ``components_attention_core.py``), every other module its path below
   ``slmlab`` (``layers_attention.py``, ``models_base.py``; a package becomes its own name,
   ``layers.py``);
3. rewrites every slmlab import, relative or absolute, into ``from .<flat name> import ...``;
4. checks the result: no file imports ``slmlab``, and every relative import names a written file;
5. sets the ``auto_map`` on the configuration class too (a config built in code then has it).

A module that imports an slmlab *module object* (``from . import x`` where ``x`` is a module,
``import slmlab.x``) cannot be flattened this way and is refused with the module's name.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

ROOT = "slmlab"


@dataclass(frozen=True)
class SourceModule:
    name: str  # dotted module name, e.g. slmlab.models.pgsm.modeling_pgsm
    path: Path
    is_package: bool


def _find(name: str) -> SourceModule | None:
    """The source of slmlab module ``name`` (None if it is not a module, e.g. a class name)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return SourceModule(name, Path(spec.origin), spec.submodule_search_locations is not None)


def _absolute(module: SourceModule, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` reads from."""
    if node.level == 0:
        return node.module or ""
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _is_ours(name: str) -> bool:
    return name == ROOT or name.startswith(ROOT + ".")


def _slmlab_imports(module: SourceModule, tree: ast.AST) -> list[tuple[ast.stmt, str]]:
    """``(node, absolute module)`` of every import of an slmlab module in ``tree``; refuses imports
    of module objects, which have no flat spelling."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if _is_ours(a.name)]
            if bad:
                raise ValueError(f"{module.name} imports slmlab module {bad[0]} as a module object (`import ...`);"
                                 " import names from it instead so it can be exported as remote code")
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            if not _is_ours(target):
                continue
            for alias in node.names:
                if alias.name != "*" and _find(f"{target}.{alias.name}") is not None:
                    raise ValueError(f"{module.name} imports the module {target}.{alias.name} as an object; import"
                                     " names from it instead so it can be exported as remote code")
            found.append((node, target))
    return found


def module_closure(roots: list[str]) -> dict[str, SourceModule]:
    """Every slmlab module that ``roots`` import, transitively (``roots`` included)."""
    seen: dict[str, SourceModule] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        module = _find(name)
        if module is None:
            raise ValueError(f"no source file for slmlab module {name}")
        seen[name] = module
        tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
        todo.extend(target for _, target in _slmlab_imports(module, tree))
    return seen


def flat_names(modules: dict[str, SourceModule], family_package: str) -> dict[str, str]:
    """Module name -> flat file stem (without ``.py``); two modules on one stem are refused."""
    names: dict[str, str] = {}
    for name in modules:
        base = family_package if name.startswith(family_package + ".") else ROOT
        stem = name[len(base) + 1:].replace(".", "_") if name != base else base.rsplit(".", 1)[-1]
        if stem in names.values():
            other = next(k for k, v in names.items() if v == stem)
            raise ValueError(f"{name} and {other} would both be flattened to {stem}.py")
        names[name] = stem
    return names


def _rewrite(module: SourceModule, names: dict[str, str]) -> str:
    """``module``'s source with every slmlab import turned into ``from .<flat> import ...``."""
    source = module.path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(lineno: int, col: int) -> int:  # ast columns are UTF-8 byte offsets
        return offsets[lineno - 1] + len(lines[lineno - 1].encode("utf-8")[:col].decode("utf-8"))

    edits = []
    for node, target in _slmlab_imports(module, tree):
        aliases = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
        edits.append((at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset),
                      f"from .{names[target]} import {aliases}"))
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return f"# {module.name}, flattened by slmlab's exporter for transformers' remote-code loader.\n" + source


def check_flat_folder(folder: Path, stems: set[str]) -> None:
    """Every flattened file imports nothing of slmlab and only flattened files relatively."""
    for stem in sorted(stems):
        tree = ast.parse((folder / f"{stem}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    mods = [node.module or ""]
                elif node.level != 1 or node.module not in stems:
                    raise RuntimeError(f"{stem}.py: relative import {'.' * node.level}{node.module or ''} is not a"
                                       " flattened file")
            if any(_is_ours(m) for m in mods):
                raise RuntimeError(f"{stem}.py still imports slmlab ({mods})")


def write_remote_code(config, model, folder: Path) -> dict[str, str]:
    """Write the flattened source of ``model`` (and its ``config``) into ``folder``; returns the
    ``auto_map`` for ``config.json`` (``AutoConfig`` and ``AutoModelForCausalLM``)."""
    config_cls, model_cls = type(config), type(model)
    family_package = model_cls.__module__.rsplit(".", 1)[0]
    modules = module_closure([config_cls.__module__, model_cls.__module__])
    names = flat_names(modules, family_package)
    for name, module in modules.items():
        (Path(folder) / f"{names[name]}.py").write_text(_rewrite(module, names), encoding="utf-8")
    check_flat_folder(Path(folder), set(names.values()))
    auto_map = {
        "AutoConfig": f"{names[config_cls.__module__]}.{config_cls.__name__}",
        "AutoModelForCausalLM": f"{names[model_cls.__module__]}.{model_cls.__name__}",
    }
    # The class holds it too: a config built in code from the folder's class (not from config.json)
    # then names its entry points, and save_pretrained writes them (the instance keeps a loaded one).
    config_file = Path(folder) / f"{names[config_cls.__module__]}.py"
    with config_file.open("a", encoding="utf-8") as f:
        f.write(f"\n\n# This folder's remote-code entry points, written by slmlab's exporter.\n"
                f"{config_cls.__name__}.auto_map = {auto_map!r}\n")
    return auto_map
