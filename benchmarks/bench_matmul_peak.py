"""The machine's matrix-product peak per number format: the physical anchor a CPU result is read against.

One process, one thread, CPU time: ``[m, n] @ [n, n]`` products in fp32, bf16 and int8 (``torch._int_mm``,
int32 accumulation), each repeated until ``seconds`` of CPU time pass (at least twice), reported in
GFLOP/s (2·m·n·n operations a product) with the ratio to fp32, beside the CPU's name and the flags that
decide which units run them (AVX2, AVX512, AVX512-BF16/VNNI, AMX). A CPU without bf16 units emulates
bf16 products at a fraction of fp32's speed, which is why ``precision=auto`` stays fp32 on the CPU.

    python benchmarks/bench_matmul_peak.py [--m 2048] [--sizes 256,768] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")


def cpu_facts() -> dict:
    """The CPU's model name, torch's kernel capability and which of :data:`FLAGS` ``/proc/cpuinfo`` lists."""
    name, flags = platform.processor() or "unknown", set()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:  # not Linux: the name only
        pass
    return {"cpu": name, "torch capability": torch.backends.cpu.get_cpu_capability(),
            "flags": [f for f in FLAGS if f in flags]}


def operands(fmt: str, m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if fmt == "int8":
        return (torch.randint(-128, 128, (m, n), generator=g, dtype=torch.int8),
                torch.randint(-128, 128, (n, n), generator=g, dtype=torch.int8))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[fmt]
    return torch.randn(m, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)


def product(fmt: str):
    return torch._int_mm if fmt == "int8" else torch.matmul


def measure(fmt: str, m: int, n: int, seconds: float) -> dict:
    """One format at one size: ``{"format", "n", "products", "cpu_s", "gflops"}`` (``gflops`` None when this
    torch has no CPU kernel for the format)."""
    a, b = operands(fmt, m, n)
    run = product(fmt)
    try:
        run(a, b)  # warm-up, and the check that a kernel exists
    except (RuntimeError, NotImplementedError):
        return {"format": fmt, "n": n, "products": 0, "cpu_s": 0.0, "gflops": None}
    count, start = 0, time.process_time()
    while count < 2 or time.process_time() - start < seconds:
        run(a, b)
        count += 1
    spent = time.process_time() - start
    return {"format": fmt, "n": n, "products": count, "cpu_s": spent, "gflops": 2 * m * n * n * count / spent / 1e9}


def peaks(m: int = 2048, sizes: tuple[int, ...] = (256, 768), seconds: float = 1.0) -> list[dict]:
    """Every format at every size, one thread, with ``x fp32`` (this format's GFLOP/s over fp32's at that size)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [measure(fmt, m, n, seconds) for n in sizes for fmt in ("fp32", "bf16", "int8")]
    finally:
        torch.set_num_threads(threads)
    for row in rows:
        fp32 = next(r["gflops"] for r in rows if r["n"] == row["n"] and r["format"] == "fp32")
        row["x fp32"] = None if row["gflops"] is None else row["gflops"] / fp32
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=2048, help="rows of the left operand (default: %(default)s)")
    p.add_argument("--sizes", default="256,768", help="n of the [n, n] right operand, comma-separated")
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per format and size (default: %(default)s)")
    args = p.parse_args()
    facts = cpu_facts()
    print(f"{facts['cpu']} | torch {torch.__version__}, kernels {facts['torch capability']} |"
          f" flags: {', '.join(facts['flags']) or 'none of ' + ', '.join(FLAGS)}")
    print("| format | n | GFLOP/s | x fp32 |\n|---|---|---|---|")
    for r in peaks(args.m, tuple(int(s) for s in args.sizes.split(",")), args.seconds):
        shown = "no CPU kernel" if r["gflops"] is None else f"{r['gflops']:.1f}"
        ratio = "" if r["x fp32"] is None else f"{r['x fp32']:.3f}"
        print(f"| {r['format']} | {r['n']} | {shown} | {ratio} |")


if __name__ == "__main__":
    main()
