"""Load a file of scripts/ as a module, for the tests of the repository's own tools (scripts/ is not a
package: the scripts run as `python scripts/NAME.py`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    """``scripts/NAME.py`` as a module named NAME."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
