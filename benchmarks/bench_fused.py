"""Fused projections (q|k|v and gate|up as one GEMM over concatenated weights) vs separate ones.

slmlab's attention and SwiGLU concatenate their projection weights and run one GEMM
(``slmlab.layers.fused.ConcatenatedWeights``; inside ``frozen_weights()`` the concatenation is cached
for a whole generation). This script measures what that buys, in one process, timed in turns:

* training step (forward + backward + AdamW) of the default Lumen (``lumen-3m``) on the quickstart's
  batch (16 x 128): slmlab fused, the same model with separate projections (patched onto the same
  modules), and transformers' ``LlamaForCausalLM`` on the same weights (separate projections);
* the same, with the model ``torch.compile``-d (``--compile``; inductor, one compile each);
* batch-1 greedy decode through the model's forward (transformers' ``generate``, 64 new tokens),
  where the fused weights are cached for the generation.

    .venv/bin/python benchmarks/bench_fused.py --threads 1 --clock cpu [--compile]

``--clock cpu`` times by this process's CPU time (with ``--threads 1`` on a shared machine the
ratios then measure the code, not the neighbours).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from common import adamw_step, print_table, timeit_interleaved  # noqa: E402
from slmlab.layers.attention import CausalSelfAttention, sdpa  # noqa: E402
from slmlab.layers.mlp import SwiGLU  # noqa: E402
from slmlab.layers.rotary import apply_rotary  # noqa: E402
from slmlab.models.lumen import LumenConfig, LumenForCausalLM  # noqa: E402


def separate_attention(self: CausalSelfAttention, x, cos, sin, bias, state=None):
    """``CausalSelfAttention.forward`` with three projections instead of one fused GEMM."""
    b, t, _ = x.shape
    q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim)).transpose(1, 2)
    k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
    v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if state is not None:
        k, v = state.update(k, v)
    out = sdpa(q, k, v, bias, self.dropout if self.training else 0.0)
    return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def separate_swiglu(self: SwiGLU, x):
    """``SwiGLU.forward`` with separate gate and up GEMMs."""
    return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def with_separate_projections(model: LumenForCausalLM) -> LumenForCausalLM:
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.forward = types.MethodType(separate_attention, module)
        elif isinstance(module, SwiGLU):
            module.forward = types.MethodType(separate_swiglu, module)
    return model


def triplets(cfg: LumenConfig) -> dict[str, torch.nn.Module]:
    """The three sides on the same weights."""
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_dim, intermediate_size=cfg.intermediate_dim,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
            max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
            tie_word_embeddings=True,
        )
    )
    fused, separate = LumenForCausalLM(cfg), LumenForCausalLM(cfg)
    fused.load_state_dict(llama.state_dict(), strict=True)
    separate.load_state_dict(llama.state_dict(), strict=True)
    return {"transformers Llama": llama, "slmlab fused": fused, "slmlab separate": with_separate_projections(separate)}


def check_same_loss(sides: dict[str, torch.nn.Module], ids: torch.Tensor) -> None:
    with torch.no_grad():
        losses = {name: float(m(input_ids=ids, labels=ids).loss) for name, m in sides.items()}
    spread = max(losses.values()) - min(losses.values())
    if spread > 1e-4:
        raise SystemExit(f"the sides disagree (losses {losses}): not the same model")


def training_rows(sides: dict[str, torch.nn.Module], ids: torch.Tensor, repeats: int, clock, compiled: bool) -> list[dict]:
    if compiled:
        steps = {}
        for name, model in sides.items():
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            run = torch.compile(model)

            def step(run=run, opt=opt) -> None:
                opt.zero_grad(set_to_none=True)
                run(input_ids=ids, labels=ids).loss.backward()
                opt.step()

            t0 = time.perf_counter()
            step()  # compiles
            print(f"  compiled {name} in {time.perf_counter() - t0:.1f} s", flush=True)
            steps[name] = step
    else:
        steps = {name: adamw_step(model, ids) for name, model in sides.items()}
    times = timeit_interleaved(steps, repeats, clock=clock)
    base = times["transformers Llama"]
    return [{"side": name, "tokens/s": ids.numel() / sec, "vs Llama": base / sec} for name, sec in times.items()]


def decode_rows(sides: dict[str, torch.nn.Module], vocab: int, repeats: int, clock, new: int = 64) -> list[dict]:
    prompt = torch.randint(0, vocab, (1, 32))
    runs = {}
    for name, model in sides.items():
        model.eval()

        def run(model=model):
            with torch.no_grad():
                return model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)

        runs[name] = run
    # random weights give near-tied logits, so greedy tokens may part ways between the sides after a
    # few steps: the prompt's logits must agree, and every side decodes the same number of tokens
    with torch.no_grad():
        logits = {name: model(prompt).logits for name, model in sides.items()}
    first = next(iter(logits.values()))
    if any((x - first).abs().max() > 1e-4 for x in logits.values()):
        raise SystemExit("the sides' logits disagree: not the same model")
    times = timeit_interleaved(runs, repeats, clock=clock)
    base = times["transformers Llama"]
    return [{"side": name, "tokens/s": new / sec, "vs Llama": base / sec} for name, sec in times.items()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--compile", action="store_true", help="also time the torch.compile-d training step")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed time (default). cpu: this process's CPU time (with --threads 1)")
    args = p.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    cfg = LumenConfig()
    sides = triplets(cfg)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
    check_same_loss(sides, ids)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), clock {args.clock}, lumen-3m, "
          f"batch {args.batch} x {args.seq}")
    print_table(training_rows(sides, ids, args.repeats, clock, False), "training step, eager (tokens/s)")
    if args.compile:
        print_table(training_rows(sides, ids, args.repeats, clock, True), "training step, torch.compile (tokens/s)")
    print_table(decode_rows(sides, cfg.vocab_size, args.repeats, clock), "batch-1 greedy decode through forward (tokens/s)")


if __name__ == "__main__":
    main()
