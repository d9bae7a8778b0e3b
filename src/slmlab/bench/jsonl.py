"""Result lines: the ``results.jsonl`` files `slmlab bench` and `slmlab compare` append to, one JSON
object per finished run, each carrying the schema version that wrote it."""

from __future__ import annotations

import json
from pathlib import Path


def read_result_lines(path: Path, schema: str, what: str, missing_hint: str, schema_hint: str) -> list[dict]:
    """The lines of ``path`` (``results.jsonl`` or a folder holding one), blank lines skipped.

    Raises:
        FileNotFoundError: no such file (the message ends with ``missing_hint``).
        ValueError: a line that is not a JSON object, or one from another ``schema`` (ends with ``schema_hint``).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no {what} results at {path}; {missing_hint}")
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"{path}:{number} is not a JSON line; the file is damaged: remove that line") from None
        got = line.get("schema") if isinstance(line, dict) else None
        if got != schema:
            raise ValueError(f"{path}:{number} has schema {got!r}, this slmlab reads {schema!r}; {schema_hint}")
        lines.append(line)
    return lines


def last_written(lines: list[dict], identity) -> list[dict]:
    """One line per ``identity(line)``, the last one written, in the order of those last lines."""
    by_id: dict = {}
    for line in lines:
        key = identity(line)
        by_id.pop(key, None)
        by_id[key] = line
    return list(by_id.values())
