"""What the serve tests share: tiny checkpoints with a tokenizer, and a server in a subprocess."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[2]

# Tiny configs per family, all on the byte tokenizer's 259 ids.
TINY = {
    "lumen": dict(hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=64, max_seq_len=2048),
    "lfm2": dict(hidden_size=32, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, num_layers=4,
                 layer_order=["conv", "attn", "conv", "attn"], block_multiple_of=16, max_position_embeddings=256),
    "pgsm": dict(block_size=256, dim=32, layers=2, hidden=48, kernel_size=5, retrieval_dim=16, retrieval_heads=2),
    "nanohammer": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, num_state_heads=3, state_hidden_size=12, max_position_embeddings=256),
    "neollm": None,  # the neollm-tiny preset
}
PRINTABLE = list(range(32, 127))


def build_checkpoint(family: str, folder: Path, seed: int = 0, tiny: bool = True, **overrides) -> Path:
    """A random model of ``family`` (its tiny test config, or with ``tiny=False`` the family's default
    preset) saved with the byte tokenizer. Its head only scores printable ASCII
    (every other row, end-of-text included, is zero and always loses to the best printable one), and
    its weights are larger than at initialisation, so greedy completions are varied readable text of
    exactly ``max_tokens`` tokens."""
    from slmlab.data.tokenizers import byte_tokenizer
    from slmlab.models.registry import get_family
    from slmlab.train.run import attach_tokenizer

    fam = get_family(family)
    tokenizer = byte_tokenizer()
    kwargs = (TINY[family] or {}) if tiny else {}
    preset = f"{family}-tiny" if tiny and TINY[family] is None else None
    torch.manual_seed(seed)
    model = fam.model_class(fam.make_config(preset, vocab_size=len(tokenizer), tie_word_embeddings=False,
                                            **{**kwargs, **overrides})).eval()
    attach_tokenizer(model, tokenizer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "table" not in name:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
        head = model.get_output_embeddings().weight
        keep = torch.zeros(head.shape[0], dtype=torch.bool)
        keep[PRINTABLE] = True
        head[~keep] = 0.0
        head[keep] *= 4.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(checkpoint: Path, *args: str, startup_s: float = 180.0, preload: str | None = None):
    """``slmlab serve checkpoint *args`` on a free localhost port; yields ``(base_url, process)``.

    ``preload``: Python code the server process runs before ``slmlab.cli.main`` (to inject a fault)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    log = open(checkpoint.parent / f"serve-{port}.log", "w+")  # noqa: SIM115 - closed below
    start = ["-m", "slmlab.cli"] if preload is None else [
        "-c", f"{preload}\nimport sys\nfrom slmlab.cli import main\nsys.exit(main(sys.argv[1:]))"]
    proc = subprocess.Popen([sys.executable, *start, "serve", str(checkpoint), "--port", str(port),
                             "--threads", "1", *args], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"slmlab serve exited {proc.returncode}:\n{log.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("slmlab serve did not answer /health in time")
            time.sleep(0.2)
        proc.log = log
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def server_log(proc) -> str:
    proc.log.seek(0)
    return proc.log.read()
