"""`slmlab serve` under concurrent clients: tokens/s and time to first token, batched vs one at a time.

For each family (default preset, byte-level tokenizer, random weights: speed does not depend on
what was learned), two servers run from the same checkpoint: ``--max-batch 1`` (one request at a
time; through ``slmlab.generation.generate`` and the family's decode plan when it has one) and
``--max-batch 32`` (continuous batching). The same requests (greedy, ``--tokens`` new tokens each)
go to the first one after another, then to the second from 1, 4, 16 and 32 concurrent streaming
clients (with one client the batching server serves each request alone, through ``generate``, as
``--max-batch 1`` does: its ``x alone`` there should be ~1). When llama-cpp-python's server is
installed (``pip install 'llama-cpp-python[server]'``; not in CI), the GGUF export of the lumen
checkpoint (``slmlab export --to gguf``) is served by it and measured with the same requests, not
streamed (its stream holds back byte tokens that end inside a UTF-8 character, which random weights
on a byte-level vocabulary produce all the time, so only a whole answer's ``usage`` counts them; no
time to first token); without it the script says so.
Tokens/s counts the completion tokens the server reports (``usage``) per second of wall
clock, and per second of the server process's CPU time (user + system, all threads, from /proc on
Linux): on a machine shared with other work the wall clock also measures the scheduler, the CPU
time only the server. The ``x alone`` columns are ratios to the one-at-a-time server; time to first
token is the median over the requests.

    nice python benchmarks/bench_serve.py                       # lumen and pgsm, 1 thread
    python benchmarks/bench_serve.py --families lumen --threads 2 --requests 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]


def build_checkpoint(family: str, folder: Path) -> Path:
    """The family's default preset on the byte tokenizer (259 ids), saved with it."""
    from slmlab.data.tokenizers import byte_tokenizer
    from slmlab.models.registry import get_family
    from slmlab.train.run import attach_tokenizer

    fam = get_family(family)
    tokenizer = byte_tokenizer()
    torch.manual_seed(0)
    model = fam.model_class(fam.make_config(None, vocab_size=len(tokenizer))).eval()
    attach_tokenizer(model, tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all threads), from /proc; NaN elsewhere."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.is_file():
        return float("nan")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server(ckpt: Path, *args: str, command: list[str] | None = None, ready: str = "/health"):
    """``slmlab serve ckpt *args`` (or ``command`` with ``--port``) on a free port: ``(url, pid)``."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    command = command or [sys.executable, "-m", "slmlab.cli", "serve", str(ckpt)]
    proc = subprocess.Popen([*command, "--port", str(port), *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            if proc.poll() is not None:
                raise RuntimeError(f"{command[2]} exited {proc.returncode}: {proc.stderr.read()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}{ready}", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def stream_one(http: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> tuple[int, float, str]:
    """One streamed greedy completion: ``(completion tokens, seconds to first text, text)``."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, used, pieces, text = time.perf_counter(), None, 0, 0, []
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                used = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                if choice["text"] and first is None:
                    first = time.perf_counter() - start
                pieces += bool(choice["text"])
                text.append(choice["text"])
    # a server without stream_options.include_usage streams one chunk per token
    return used or pieces, first if first is not None else time.perf_counter() - start, "".join(text)


async def complete_one(http: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> tuple[int, float, str]:
    """One greedy completion, not streamed: ``(completion tokens from usage, NaN, text)``."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0}
    response = await http.post(f"{url}/v1/completions", json=body)
    response.raise_for_status()
    out = response.json()
    return out["usage"]["completion_tokens"], float("nan"), out["choices"][0]["text"]


def run_level(url: str, pid: int, prompts: list[str], tokens: int, clients: int, stream: bool = True) -> dict:
    """All ``prompts`` through ``clients`` concurrent clients (streaming, or not): tokens/s of wall clock
    and of server CPU time, median time to first token (NaN when not streamed)."""
    before = cpu_seconds(pid)
    out = asyncio.run(_run_level(url, prompts, tokens, clients, stream_one if stream else complete_one))
    out["cpu tok/s"] = out["tokens"] / max(cpu_seconds(pid) - before, 1e-9)
    return out


async def _run_level(url: str, prompts: list[str], tokens: int, clients: int, one=stream_one) -> dict:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        queue = list(prompts)
        results = []

        async def client() -> None:
            while queue:
                results.append(await one(http, url, queue.pop(0), tokens))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - start
    used = sum(r[0] for r in results)
    return {"tok/s": used / wall, "ttft": statistics.median(r[1] for r in results), "tokens": used, "wall": wall}


def llama_server_available() -> bool:
    """llama-cpp-python with its server extra (``pip install 'llama-cpp-python[server]'``)."""
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError:
        return False
    return True


def bench_llama_server(ckpt: Path, tmp: Path, prompts: list[str], args, alone: dict) -> list[dict]:
    """The same requests against llama.cpp's server (llama-cpp-python) on the GGUF export of ``ckpt``."""
    gguf = tmp / "model.gguf"
    subprocess.run([sys.executable, "-m", "slmlab.cli", "export", str(ckpt), "--to", "gguf", str(gguf)], check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), stdout=subprocess.DEVNULL)
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf)]
    # its default interrupts a running stream when the next request arrives; these requests queue instead
    options = ("--n_threads", str(args.threads), "--n_ctx", "1024", "--interrupt_requests", "False")
    with server(ckpt, *options, command=command, ready="/v1/models") as (url, pid):
        # not streamed: its stream holds back the text of byte tokens that end inside a UTF-8 character
        # (random weights on a byte-level vocabulary), so only the usage of a whole answer counts them
        run_level(url, pid, prompts[:2], args.tokens, 1, stream=False)  # warm-up
        for clients in args.clients:
            level = run_level(url, pid, prompts, args.tokens, clients, stream=False)
            yield {"family": "lumen", "server": "llama-server", "clients": clients, **level,
                   "ratio": level["tok/s"] / alone["tok/s"], "cpu ratio": level["cpu tok/s"] / alone["cpu tok/s"]}


def bench_family(family: str, args):
    """Yields the rows of one family as they are measured."""
    prompts = [f"Client {i} says" + " hello" * (i % 4) for i in range(args.requests)]  # 15 to 33 tokens
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(family, Path(tmp) / family)
        with server(ckpt, "--max-batch", "1", "--threads", str(args.threads)) as (url, pid):
            run_level(url, pid, prompts[:2], args.tokens, 1)  # warm-up
            alone = run_level(url, pid, prompts, args.tokens, 1)
        yield {"family": family, "server": "one at a time", "clients": 1, **alone, "ratio": 1.0, "cpu ratio": 1.0}
        with server(ckpt, "--max-batch", str(args.max_batch), "--threads", str(args.threads)) as (url, pid):
            run_level(url, pid, prompts[:4], args.tokens, 4)  # warm-up
            for clients in args.clients:
                level = run_level(url, pid, prompts, args.tokens, clients)
                yield {"family": family, "server": f"--max-batch {args.max_batch}", "clients": clients, **level,
                       "ratio": level["tok/s"] / alone["tok/s"], "cpu ratio": level["cpu tok/s"] / alone["cpu tok/s"]}
        if family == "lumen" and llama_server_available():
            try:
                yield from bench_llama_server(ckpt, Path(tmp), prompts, args, alone)
            except (httpx.HTTPError, RuntimeError) as err:
                print(f"# llama-cpp-python's server failed during the measurement: {type(err).__name__}: {err}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", default=["lumen", "pgsm"])
    p.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16, 32])
    p.add_argument("--requests", type=int, default=64, help="requests per level")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--max-batch", type=int, default=32)
    args = p.parse_args()
    load = os.getloadavg()
    print(f"# {args.requests} requests x {args.tokens} tokens per level, server threads {args.threads},"
          f" {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start")
    print(f"{'family':<8} {'server':<14} {'clients':>7} {'tok/s':>8} {'x alone':>8} {'cpu tok/s':>9} {'x alone':>8}"
          f" {'TTFT ms':>8} {'wall s':>7}")
    for family in args.families:
        for row in bench_family(family, args):
            print(f"{row['family']:<8} {row['server']:<14} {row['clients']:>7} {row['tok/s']:>8.0f} {row['ratio']:>8.2f}"
                  f" {row['cpu tok/s']:>9.0f} {row['cpu ratio']:>8.2f} {row['ttft'] * 1000:>8.0f} {row['wall']:>7.2f}",
                  flush=True)
    if "lumen" in args.families and not llama_server_available():
        print("# llama.cpp's llama-server: not run (pip install 'llama-cpp-python[server]' to add its rows for lumen)")
    load = os.getloadavg()
    print(f"# load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")


if __name__ == "__main__":
    main()
