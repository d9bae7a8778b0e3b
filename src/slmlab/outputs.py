"""One promise for every folder a command writes (``slmlab quantize OUT``, ``finetune --merge --out``).

1. The target is refused when it is a file or a non-empty folder, unless it is the command's own
   earlier output, which the caller recognises (``own``) and which is then replaced whole.
2. Everything is written into a temporary sibling folder (``.<name>.tmp-*``, beside the target, so the
   rename stays on one file system) and renamed onto the target at the end: a crash or a refusal
   midway leaves no partial target, only the temporary, which is removed.
3. A source that may change while it is read (a live run rotating its checkpoints) is fingerprinted
   before (:func:`snapshot`) and checked after (:func:`check_unchanged`): a change is refused, never
   half-copied.

Files and folders it publishes get the modes the user's umask gives ordinary files (0644 / 0755 under
the usual 022), not the 0600 / 0700 of the temporaries they were written as (:func:`publish_modes`).
Every report and JSON file a command writes goes through :func:`dumps_finite`: a number that is not
finite is written ``null``, never the bare ``NaN`` that strict JSON parsers refuse. Standard library
only: every layer may use it.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def check_output_folder(out: str | Path, flag: str = "OUT", own: Callable[[Path], bool] | None = None) -> Path:
    """``out`` as a Path when a command may write it: absent, an empty folder, or (``own(out)`` true) the
    command's own earlier output.

    Raises:
        ValueError: ``out`` is a symbolic link, a file, or a non-empty folder that is not the command's own.
    """
    out = Path(out)
    if out.is_symlink():  # the rename would replace the link, not write where it points
        raise ValueError(f"{flag} {out} is a symbolic link (to {os.readlink(out)}); name the folder itself or a new one")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out} is a file; choose a new folder")
    if out.is_dir() and any(out.iterdir()) and not (own is not None and own(out)):
        raise ValueError(f"{flag} {out} exists and is not an empty folder (its files would be replaced or mixed with the"
                         " new ones); choose a new folder or remove it")
    return out


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_modes(folder: str | Path) -> None:
    """Give ``folder`` and everything under it the modes of ordinary new files and folders (``0o666`` /
    ``0o777`` less the umask): temporaries from :mod:`tempfile` are private (0600 / 0700)."""
    mask = _umask()
    folder = Path(folder)
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)


def publish_file_mode(path: str | Path) -> None:
    """Give one file the mode of an ordinary new file (``0o666`` less the umask): a file written through
    :func:`tempfile.mkstemp` and renamed into place would otherwise stay private (0600)."""
    os.chmod(path, 0o666 & ~_umask())


@contextmanager
def staged_folder(out: str | Path, flag: str = "OUT", own: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Write a folder through a temporary sibling: yields the temporary folder; on a normal exit it
    becomes ``out`` (an empty ``out``, or the command's own earlier output, is replaced), on an
    exception it is removed and ``out`` is as it was.

    Args:
        out: the target folder (checked by :func:`check_output_folder` first, and again at the rename).
        flag: how the command names the target in messages (``OUT``, ``--out``).
        own: recognises the command's own earlier output, which may be replaced.
    Raises:
        ValueError: the target is not writable by the rule above, before or (another process wrote it
            meanwhile) after the temporary was filled.
    """
    out = check_output_folder(out, flag, own)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        check_output_folder(out, flag, own)
        publish_modes(tmp)
        _replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _replace(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` onto ``out`` (absent, empty, or an earlier output moved aside first and removed)."""
    old = None
    if out.is_dir() and any(out.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    elif out.is_dir():
        out.rmdir()
    try:
        os.rename(tmp, out)
    except OSError:
        if old is not None:  # put the earlier output back
            os.replace(old / out.name, out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def snapshot(folder: str | Path) -> dict[str, tuple[int, int]]:
    """A fingerprint of the files under ``folder``: relative path -> ``(size, mtime_ns)``."""
    folder = Path(folder)
    found = {}
    for path in sorted(folder.rglob("*")):
        try:
            if path.is_file():
                stat = path.stat()
                found[path.relative_to(folder).as_posix()] = (stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:  # removed between the listing and the stat: a change the check will see
            continue
    return found


def check_unchanged(folder: str | Path, before: dict[str, tuple[int, int]]) -> None:
    """Refuse a source folder whose files changed since ``before`` (:func:`snapshot`).

    Raises:
        ValueError: naming a changed, removed or added file and what to do.
    """
    after = snapshot(folder)
    if after == before:
        return
    changed = sorted(set(before) ^ set(after)) + sorted(k for k in set(before) & set(after) if before[k] != after[k])
    raise ValueError(f"{folder} changed while it was read ({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}):"
                     " a live run may be writing or rotating it; point at a checkpoint that no run is writing, or wait"
                     " for the run to finish, then rerun")


def finite(value):
    """``value`` with every non-finite number (NaN, +-inf; numpy's too) replaced by None, through dicts,
    lists and tuples: what a report or a JSON file holds is valid JSON (``null``), never a bare ``NaN``."""
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        number = float(value)
        return number if math.isfinite(number) else None
    return value


def dumps_finite(value, **kwargs) -> str:
    """``json.dumps`` of :func:`finite` ``(value)``, strict (``allow_nan=False``): the one way every report
    and JSON file slmlab writes is serialised."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
