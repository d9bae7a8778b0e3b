"""A before/after pass over the command line: run a fixed list of small `slmlab` commands and write what
they print and the files they write, with timings masked, so that two trees can be compared byte for byte.

    python scripts/cli_snapshot.py OUT            # the tree on PYTHONPATH (or the installed slmlab)
    PYTHONPATH=other/src python scripts/cli_snapshot.py OUT2 && diff -r OUT OUT2

OUT/NN-name.txt holds a command's exit status, stdout and stderr; OUT/files.txt the sha256 of every file
the commands wrote (text files after masking). A refactor that keeps behaviour leaves `diff -r` empty.
Timings (tokens/s, seconds, ETA), the work folder's path and process ids are masked; everything else
counts. It takes a few minutes on two CPU cores (tiny models, a few steps each).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# A line naming one of these is a timing line: its numbers are masked.
TIMING = re.compile(r"time|tok/s|tokens/s|per_s|_s\b|_s\"|elapsed|\bETA\b|\beta\b|second|wall|speed|\bsec\b|duration"
                    r"|it/s|\bms\b|\d\s*s\b|\d(\.\d+)?s/|\d+:\d\d|/s\b|pid|load", re.IGNORECASE)
NUMBER = re.compile(r"\d+(,\d{3})*(\.\d+)?(e[-+]?\d+)?")
TEXT = {".json", ".jsonl", ".md", ".yaml", ".yml", ".txt", ".csv", ".log", ".jinja", ""}
VOLATILE = {".lock"}  # files whose content is a pid or a clock


def mask(text: str, work: str) -> str:
    """``text`` with the work folder's path replaced and the numbers of timing lines masked."""
    text = text.replace(work, "<W>")
    return "\n".join(NUMBER.sub("N", line) if TIMING.search(line) else line for line in text.split("\n"))


def commands(w: Path) -> list[tuple[str, list[str], str | None]]:
    """(name, argv after `slmlab`, stdin) for each command of the pass, in order (later ones read earlier
    ones' folders)."""
    run, text = str(w / "run"), str(w / "corpus.txt")
    tiny = ["model=lumen", "model_config.hidden_dim=32", "model_config.num_layers=2", "model_config.num_heads=2",
            "model_config.num_kv_heads=1", "model_config.intermediate_dim=64", "model_config.max_seq_len=64",
            "block_size=32", "batch_size=4", "max_steps=6", "eval_every=3", "checkpoint_every=3", "seed=3",
            "progress=false", "eval_batches=2", "final_eval_tokens=512"]
    return [
        ("models", ["models"], None),
        ("audit", ["audit", "lumen"], None),
        ("audit-neollm", ["audit", "neollm"], None),
        ("tokenizer", ["tokenizer", "train", "--data", text, "--vocab-size", "300", "--out", str(w / "tok")], None),
        ("train", ["train", f"data={text}", f"tokenizer={w / 'tok'}", f"out_dir={run}", *tiny], None),
        ("train-again", ["train", f"data={text}", f"tokenizer={w / 'tok'}", f"out_dir={run}", *tiny, "--resume"], None),
        ("train-refused", ["train", f"data={text}", f"tokenizer={w / 'tok'}", f"out_dir={run}", *tiny], None),
        ("eval", ["eval", run, "--max-batches", "2", "--no-progress"], None),
        ("eval-json", ["eval", run, "--max-batches", "2", "--json", "--no-progress"], None),
        ("eval-too-long", ["eval", run, "--block-size", "99999", "--max-batches", "1"], None),
        ("generate", ["generate", run, "--prompt", "the cat", "--max-new-tokens", "12", "--temperature", "0"], None),
        ("generate-sampled", ["generate", run, "--prompt", "a", "--max-new-tokens", "12", "--seed", "4"], None),
        ("quantize", ["quantize", run, str(w / "q8")], None),
        ("generate-q8", ["generate", str(w / "q8"), "--prompt", "the cat", "--max-new-tokens", "8",
                         "--temperature", "0"], None),
        ("generate-int4", ["generate", run, "--quantize", "int4", "--prompt", "the", "--max-new-tokens", "8",
                           "--temperature", "0"], None),
        ("export-hf", ["export", run, "--to", "hf", str(w / "hf")], None),
        ("finetune", ["finetune", run, "--data", "builtin:chat", "--out", str(w / "ft"), "max_steps=3",
                      "batch_size=2", "progress=false"], None),
        ("finetune-eval", ["finetune", str(w / "ft"), "--data", "builtin:chat", "--eval-only"], None),
        ("chat", ["chat", str(w / "ft"), "--temperature", "0", "--max-new-tokens", "8"], "hello\n/reset\n2+2?\n"),
        ("compare", ["compare", "--models", "lumen,lfm2", "--budget", "20k", "--tasks", "mqar:cpu", "--steps", "6",
                     "--seeds", "0", "--out", str(w / "cmp"), "--threads", "1"], None),
        ("bench-list", ["bench", "list"], None),
        ("bench-dry", ["bench", "run", "--tier", "cpu-smoke", "--dry-run"], None),
        ("compare-report", ["compare", "--report-only", str(w / "cmp")], None),
        ("txn-generate", ["transactions", "generate", "--preset", "tiny", "--seed", "5", "--out", str(w / "bank"),
                          "n_customers=40", "n_days=30"], None),
        ("txn-pretrain", ["transactions", "pretrain", "--data", str(w / "bank"), "--out", str(w / "pre"),
                          "--threads", "1", "--device", "cpu", "max_steps=2", "batch_size=8", "progress=false"], None),
        ("txn-finetune", ["transactions", "finetune", "--data", str(w / "bank"), "--encoder", str(w / "pre"), "--out",
                          str(w / "txft"), "--threads", "1", "--device", "cpu", "max_steps=2", "batch_size=8",
                          "progress=false"], None),
        ("txn-score", ["transactions", "score", "--data", str(w / "bank"), "--model", str(w / "txft"), "--out",
                       str(w / "scores.csv"), "--threads", "1", "--device", "cpu"], None),
        ("txn-audit", ["transactions", "audit", "--preset", "lfm2_tiny"], None),
        ("misuse-missing", ["eval", str(w / "nope")], None),
        ("misuse-quantize", ["generate", run, "--quantize", "int3", "--prompt", "x"], None),
    ]


def safetensors_content(path: Path) -> bytes:
    """A safetensors file's metadata (keys sorted: their order in the header varies between processes)
    and tensors (by name), as bytes to hash."""
    import json

    import torch
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        parts = [json.dumps(f.metadata() or {}, sort_keys=True).encode()]
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            parts += [name.encode(), str(t.dtype).encode(), str(tuple(t.shape)).encode(), raw]
    return b"\0".join(parts)


def corpus() -> str:
    """A small deterministic text corpus (no download)."""
    words = "the cat sat on a mat and saw the dog run to the old tree by the river while birds sang".split()
    return "\n".join(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(600)) + "\n"


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="slmlab-snapshot-") as tmp:
        w = Path(tmp)
        (w / "corpus.txt").write_text(corpus())
        env = {**os.environ, "OMP_NUM_THREADS": "1", "SLMLAB_NO_COLOR": "1", "COLUMNS": "120"}
        for i, (name, argv, stdin) in enumerate(commands(w)):
            proc = subprocess.run([sys.executable, "-m", "slmlab.cli", *argv], input=stdin, capture_output=True,
                                  text=True, cwd=w, env=env, timeout=900)
            body = f"$ slmlab {' '.join(argv)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
            (out / f"{i:02d}-{name}.txt").write_text(mask(body, str(w)))
            print(f"{i:02d} {name}: exit {proc.returncode}", flush=True)
        lines = []
        for path in sorted(p for p in w.rglob("*") if p.is_file()):
            rel = path.relative_to(w).as_posix()
            if path.name in VOLATILE:
                lines.append(f"{'-' * 64}  {rel}")
                continue
            data = safetensors_content(path) if path.suffix == ".safetensors" else path.read_bytes()
            if path.suffix in TEXT:
                try:
                    data = mask(data.decode("utf-8"), str(w)).encode("utf-8")
                except UnicodeDecodeError:
                    pass
            lines.append(f"{hashlib.sha256(data).hexdigest()}  {rel}")
        (out / "files.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
