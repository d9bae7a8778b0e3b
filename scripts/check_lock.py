"""Compare what an environment has installed with ``requirements.lock``; exit 1 on any difference.

``scripts/setup.sh`` runs it last, so a set-up that did not install exactly the locked versions (a
package the lock does not constrain pulled in something newer, a stale environment, a resolver that
chose otherwise) fails there instead of in a test an hour later. Only the locked names are compared:
packages a user added to the environment by hand are theirs. Usage:
``python scripts/check_lock.py [requirements.lock] [--report]`` (``--report``: print the differences, exit 0).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Foo_Bar`` == ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of every ``name==version`` line (comments and blanks skipped)."""
    pins = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)", line)
        if match is None:
            raise ValueError(f"line {number}: {line!r} is not 'name==version'")
        pins[canonical(match.group(1))] = match.group(3)
    return pins


def installed_versions() -> dict[str, str]:
    """``{canonical name: version}`` of this interpreter's installed distributions, local labels dropped."""
    return {canonical(d.metadata["Name"]): d.version.split("+", 1)[0] for d in metadata.distributions()
            if d.metadata["Name"]}


def differences(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per locked package that is missing or at another version."""
    out = []
    for name, want in sorted(pins.items()):
        have = installed.get(name)
        if have is None:
            out.append(f"{name}: locked {want}, not installed")
        elif have != want:
            out.append(f"{name}: locked {want}, installed {have}")
    return out


def main(argv: list[str]) -> int:
    report = "--report" in argv  # list the differences and exit 0 (scripts/test-newest.sh)
    argv = [a for a in argv if a != "--report"]
    lock = Path(argv[0] if argv else Path(__file__).resolve().parent.parent / "requirements.lock")
    pins = read_lock(lock.read_text(encoding="utf-8"))
    bad = differences(pins, installed_versions())
    if report:
        print(f"{len(bad)} of {len(pins)} locked packages differ from {lock}" + (":" if bad else ""))
        for line in bad:
            print(f"  {line}")
        return 0
    if bad:
        print(f"check_lock: error: {len(bad)} of {len(pins)} locked packages differ from {lock}:", file=sys.stderr)
        for line in bad:
            print(f"  {line}", file=sys.stderr)
        print("check_lock: re-run scripts/setup.sh in a fresh .venv (rm -rf .venv), or refresh the lock after a green"
              " scripts/test-newest.sh (docs/contributing.md)", file=sys.stderr)
        return 1
    print(f"check_lock: all {len(pins)} locked packages installed at their locked versions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
