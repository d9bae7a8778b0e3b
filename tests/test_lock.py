"""requirements.lock, the exact versions scripts/setup.sh installs (scripts/check_lock.py compares an
environment with it; setup runs it last): the comparison finds every difference, and the lock names every
package pyproject.toml depends on, so a new dependency cannot slip in unlocked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts_module import load_script

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
ROOT = Path(__file__).resolve().parent.parent


check_lock = load_script("check_lock")


def test_lock_lines_are_read_with_canonical_names():
    pins = check_lock.read_lock("# header\nTorch==2.13.0\nPyYAML==6.0.2  # note\n\nscikit_learn==1.7.0\n")
    assert pins == {"torch": "2.13.0", "pyyaml": "6.0.2", "scikit-learn": "1.7.0"}
    with pytest.raises(ValueError, match="line 2: 'numpy>=1' is not 'name==version'"):
        check_lock.read_lock("torch==2.13.0\nnumpy>=1\n")


def test_every_difference_is_reported_and_extra_packages_are_not():
    pins = {"torch": "2.13.0", "transformers": "5.25.0", "peft": "0.21.2"}
    installed = {"torch": "2.13.0", "transformers": "5.26.0", "gradio": "6.1.0"}
    assert check_lock.differences(pins, installed) == ["peft: locked 0.21.2, not installed",
                                                       "transformers: locked 5.25.0, installed 5.26.0"]
    assert check_lock.differences(pins, {**installed, "transformers": "5.25.0", "peft": "0.21.2"}) == []


def test_main_fails_on_a_difference_and_reports_without_failing(tmp_path, capsys):
    lock = tmp_path / "requirements.lock"
    lock.write_text("pytest==0.0.1\n")  # installed here at another version
    assert check_lock.main([str(lock)]) == 1
    assert "pytest: locked 0.0.1, installed" in capsys.readouterr().err
    assert check_lock.main([str(lock), "--report"]) == 0
    assert "1 of 1 locked packages differ" in capsys.readouterr().out


def test_the_lock_pins_every_dependency_of_every_extra_setup_installs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    extras = re.search(r'-e "\.\[([a-z,]+)\]"', setup).group(1).split(",")
    wanted = list(project["dependencies"]) + [r for extra in extras for r in project["optional-dependencies"][extra]]
    names = {check_lock.canonical(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in wanted}
    pins = check_lock.read_lock((ROOT / "requirements.lock").read_text())
    assert sorted(names - set(pins)) == []
    assert "slmlab" not in pins and pins["torch"] == "2.13.0"
