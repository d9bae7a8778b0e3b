"""The error contract of every command, in one place.

An expected failure (bad input, a damaged or missing file, a full disk, an unavailable device)
prints ``slmlab <cmd>: error: <what> (<file>); <what to do>`` and exits 2; a diverged run exits 1
(the train command says so itself); an interrupted run exits 130 (Ctrl-C) or 143 (SIGTERM) after
saving. Anything else is a bug: one line says so and exits 70 (``EX_SOFTWARE``). ``--debug``
(anywhere on the command line) or ``SLMLAB_DEBUG=1`` lets every exception through with its traceback.
"""

from __future__ import annotations

import errno
import os
import re

EXIT_USAGE = 2
EXIT_INTERNAL = 70  # sysexits EX_SOFTWARE: a bug in slmlab
DEBUG_ENV = "SLMLAB_DEBUG"


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """``(debug?, argv without --debug)``: the flag, or ``SLMLAB_DEBUG`` set to a non-empty value other than 0."""
    flag = "--debug" in argv
    env = os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")
    return flag or env, [a for a in argv if a != "--debug"]


def _os_error(err: OSError) -> str | None:
    where = f" ({err.filename})" if err.filename else ""
    what = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"no space left on the device{where}; free disk space or choose another output path, then rerun"
                " (a training run continues with --resume)")
    if isinstance(err, NotADirectoryError):
        return f"{what}{where}: a path component is a file, not a folder; choose another path"
    if isinstance(err, IsADirectoryError):
        return f"{what}{where}: expected a file, found a folder; pass the file itself"
    if isinstance(err, FileExistsError):
        return f"{what}{where}; remove it or choose another path"
    if isinstance(err, PermissionError):
        return f"permission denied{where}; check the path's permissions or choose another one"
    if isinstance(err, FileNotFoundError):
        return f"{what}{where}; check the path"
    if err.errno in (errno.EROFS, errno.EIO):
        return f"{what}{where}; the disk is read-only or failing: choose another path"
    return None


def expected_error_message(err: BaseException) -> str | None:
    """The ``<what>; <what to do>`` of an expected failure, or None for a bug (which keeps its traceback)."""
    import yaml

    if isinstance(err, yaml.YAMLError):
        mark = getattr(err, "problem_mark", None)
        where = f" ({mark.name}:{mark.line + 1}:{mark.column + 1})" if mark is not None else ""
        return f"malformed YAML{where}: {getattr(err, 'problem', None) or err}; fix the file's syntax"
    if isinstance(err, FileNotFoundError) and not err.filename:
        return str(err)  # our own messages: FileNotFoundError("no run or checkpoint at ...")
    if isinstance(err, OSError):
        return _os_error(err)
    if isinstance(err, (ValueError, TypeError)):
        return str(err)
    if _out_of_memory(err):
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (f"out of memory ({first[:200]}); make the run smaller (model_config, vocab_size, batch_size,"
                " block_size) or use a machine with more memory")
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return None
    if isinstance(err, SafetensorError):
        return _safetensors_error(str(err))
    return None


def _out_of_memory(err: BaseException) -> bool:
    """A failed allocation: ``MemoryError``, torch's CUDA ``OutOfMemoryError``, or the CPU allocator's
    ``RuntimeError`` ("DefaultCPUAllocator: not enough memory" / "can't allocate memory")."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("not enough memory" in text or "can't allocate memory" in text
                                              or "out of memory" in text.lower())


_OS_ERROR = re.compile(r"I/O error: (?P<what>.*?) \(os error (?P<errno>\d+)\)(?: at path \"(?P<path>[^\"]*)\")?")


def _safetensors_error(text: str) -> str:
    """A SafetensorError said as what it is: an operating-system failure (a full disk, a missing folder, no
    permission, while reading or writing) through the OS-error table; otherwise a damaged file."""
    found = _OS_ERROR.search(text)
    if found:
        os_err = OSError(int(found["errno"]), found["what"], found["path"])
        said = _os_error(os_err)
        if said is not None:
            return said
        return f"{found['what']} ({found['path'] or 'a safetensors file'}); check the disk and the path, then rerun"
    return f"a safetensors file is corrupt ({text}); resume from an earlier checkpoint or save the model again"
