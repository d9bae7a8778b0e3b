"""Chat data: conversations from ``.jsonl`` files, and the shipped ``builtin:chat`` set.

A chat file holds one JSON object per line, either a conversation::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}]}

or a prompt/completion pair (an optional ``"system"`` string goes first)::

    {"prompt": "What is 2 + 3?", "completion": "5"}

Blank lines are skipped; every malformed line is an error naming ``file:line``. ``builtin:chat`` is
a deterministic set made in code (no download): arithmetic, capitals from a fixed table, echo and
reverse-a-word turns, some with a system line or a second turn; ``slmlab finetune --make-data
OUT.jsonl`` writes it out as a file of this format.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .chat import check_messages

BUILTIN_CHAT = "builtin:chat"
BUILTIN_CHAT_ROWS = 4000

CAPITALS = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Portugal", "Lisbon"),
    ("Ireland", "Dublin"), ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"), ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Greece", "Athens"),
    ("Hungary", "Budapest"), ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"), ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Canada", "Ottawa"), ("Mexico", "Mexico City"),
    ("Cuba", "Havana"), ("Russia", "Moscow"), ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Australia", "Canberra"),
)
WORDS = (
    "apple", "river", "stone", "cloud", "garden", "window", "silver", "candle", "forest", "bridge", "mirror",
    "planet", "pencil", "rocket", "castle", "island", "winter", "summer", "basket", "dragon", "violin", "marble",
    "harbor", "meadow", "lantern", "thunder", "pepper", "saddle", "velvet", "falcon",
)
SYSTEMS = ("You are a helpful assistant.", "Answer briefly.", "You are terse.")


def _turn(rng: random.Random) -> tuple[str, str]:
    """One user question and its answer, drawn from ``rng``."""
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randrange(50), rng.randrange(50)
        return f"What is {a} + {b}?", str(a + b)
    if kind == 1:
        a, b = rng.randrange(50), rng.randrange(50)
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", str(a - b)
    if kind == 2:
        country, city = rng.choice(CAPITALS)
        return f"What is the capital of {country}?", f"The capital of {country} is {city}."
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
    if kind == 3:
        return f"Repeat after me: {words}", words
    word = rng.choice(WORDS)
    return f"Reverse the word {word}.", word[::-1]


def builtin_chat(rows: int = BUILTIN_CHAT_ROWS, seed: int = 0) -> list[list[dict]]:
    """The shipped chat set: ``rows`` distinct conversations, the same for the same ``(rows, seed)``.
    A quarter open with a system line, a fifth have a second user/assistant turn."""
    rng = random.Random(seed)
    out: list[list[dict]] = []
    seen: set[str] = set()
    while len(out) < rows:
        messages = [{"role": "system", "content": rng.choice(SYSTEMS)}] if rng.random() < 0.25 else []
        for _ in range(2 if rng.random() < 0.2 else 1):
            question, answer = _turn(rng)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        key = json.dumps(messages)
        if key not in seen:  # distinct rows: the held-out split never repeats a training row
            seen.add(key)
            out.append(messages)
    return out


def parse_chat_row(row, where: str) -> list[dict]:
    """One decoded JSON line -> its messages (``ValueError`` naming ``where`` for a malformed row)."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object with 'messages' or 'prompt'/'completion', got"
                         f" {type(row).__name__}; write one conversation per line")
    if "messages" in row:
        messages = check_messages(row["messages"], where)
    elif "prompt" in row or "completion" in row:
        prompt, completion, system = row.get("prompt"), row.get("completion"), row.get("system")
        for name, value in (("prompt", prompt), ("completion", completion)):
            if not isinstance(value, str):
                raise ValueError(f"{where}: '{name}' must be a string, got {type(value).__name__}; give both"
                                 " 'prompt' and 'completion' as strings")
        if system is not None and not isinstance(system, str):
            raise ValueError(f"{where}: 'system' must be a string, got {type(system).__name__}")
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    else:
        raise ValueError(f"{where}: the object has neither 'messages' nor 'prompt'/'completion' (keys:"
                         f" {sorted(row)[:5]}); write {{\"messages\": [...]}} or {{\"prompt\": ..., \"completion\": ...}}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: the conversation has no assistant turn; add the answer to learn from")
    return messages


def read_chat_jsonl(path: str | Path) -> list[list[dict]]:
    """Every conversation of a ``.jsonl`` chat file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"chat data {path} does not exist; give a .jsonl file or {BUILTIN_CHAT}")
    rows = []
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{where}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1}); save"
                                 " the file as UTF-8 or fix that line") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno}); fix that line") from None
            rows.append(parse_chat_row(row, where))
    if not rows:
        raise ValueError(f"{path} holds no conversations; write one JSON object per line")
    return rows


def load_chat(spec: str) -> list[list[dict]]:
    """The conversations of a chat data spec: ``builtin:chat`` or a ``.jsonl`` file."""
    if spec == BUILTIN_CHAT:
        return builtin_chat()
    if str(spec).startswith("builtin:"):
        raise ValueError(f"unknown built-in chat set {spec!r}; the shipped one is {BUILTIN_CHAT}")
    if not str(spec).endswith(".jsonl"):
        raise ValueError(f"chat data {spec!r} must be a .jsonl file (one conversation per line) or {BUILTIN_CHAT}")
    return read_chat_jsonl(spec)


def write_chat_jsonl(rows: list[list[dict]], path: str | Path) -> Path:
    """Write conversations as a chat ``.jsonl`` file (``{"messages": [...]}`` per line); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in rows), encoding="utf-8")
    return path


def chat_identity(spec: str) -> dict:
    """What a chat data spec is, for ``--resume`` (as :func:`slmlab.data.sources.data_identity`): the
    built-in set by its name, a file by its resolved path and a hash of its bytes."""
    import hashlib

    if str(spec).startswith("builtin:"):
        return {"kind": "chat", "spec": spec}
    path = Path(spec).expanduser().resolve()
    return {"kind": "local", "path": str(path), "fingerprint": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}
