"""Decode tokens/s of the quickstart-size lumen model against llama.cpp, the CPU engine people deploy.

Rows, per thread count (1 and 2 by default), all in this one process and timed in turns: llama.cpp on
the model exported to GGUF (f32 and q8_0; ``benchmarks/llamacpp_anchor.py``), slmlab ``generate``
through the decode plan (eager and compiled) and transformers' ``LlamaForCausalLM.generate`` on the
same weights. Batch 1, the prompt "ROMEO:", 128 greedy tokens; tokens/s = 128 / (prefill + decode
time); "greedy = plan" counts the tokens equal to slmlab's before the first difference.

    .venv/bin/python benchmarks/bench_decode.py [--run runs/quickstart] [--threads 1,2] [--repeats 3]

Without ``--run``: a freshly initialised lumen-3m (the quickstart's preset: 2.75M parameters, vocab
2048) with the quickstart's 2048-token BPE trained on the Shakespeare corpus (the same tokenizer file a
quickstart run carries). Needs llama-cpp-python (``pip install "slmlab[llamacpp]"``) for its rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import generation_rows, print_table  # noqa: E402
from llamacpp_anchor import agreement, available, llama_cpp_variants  # noqa: E402
from slmlab.generation import generate  # noqa: E402
from slmlab.layers import frozen_weights  # noqa: E402


def quickstart_model(run: str | None):
    """``(lumen model, tokenizer, where it came from)``."""
    if run is not None:
        from slmlab.train.saved import load_for_inference

        loaded = load_for_inference(run, "cpu")
        return loaded.model, loaded.tokenizer, str(loaded.checkpoint)
    from slmlab.data import get_tokenizer
    from slmlab.data.sources import get_source
    from slmlab.models.lumen import LumenConfig, LumenForCausalLM

    texts = list(get_source("shakespeare", None, 128).train_texts())
    tokenizer = get_tokenizer("bpe", texts=texts, vocab_size=2048)
    torch.manual_seed(0)
    return LumenForCausalLM(LumenConfig(vocab_size=2048)).eval(), tokenizer, "fresh lumen-3m, quickstart BPE"


def llama_twin(model):
    """transformers' ``LlamaForCausalLM`` holding ``model``'s weights (lumen's names are Llama's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    twin = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_dim, intermediate_size=c.intermediate_dim,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings,
    ))
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin.eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default=None, help="a trained lumen run or checkpoint (default: a fresh lumen-3m)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed time (default). cpu: this process's CPU time, all threads (llama.cpp's"
                   " included); with --threads 1 it approximates the wall time on an idle machine")
    args = p.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    model, tokenizer, origin = quickstart_model(args.run)
    twin = llama_twin(model)
    prompt = tokenizer(args.prompt, add_special_tokens=False)["input_ids"]
    ids, new = torch.tensor([prompt]), args.new
    print(f"{origin}: {sum(q.numel() for q in model.parameters()):,} parameters; prompt {args.prompt!r} = {len(prompt)}"
          f" tokens; {new} greedy tokens; {args.clock} clock; torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} on"
          f" {os.cpu_count()} CPUs")
    if not available():
        print('llama-cpp-python is not installed: no llama.cpp rows (pip install "slmlab[llamacpp]")')

    def hf():
        with torch.inference_mode():
            return twin.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    rows = []
    # the weights never change here: a decode plan's arranged weights are reused across the calls (as a server does)
    with tempfile.TemporaryDirectory() as folder, frozen_weights():
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            reference = generate(model, ids, new)[0, len(prompt):].tolist()
            ours = {
                f"slmlab generate (decode plan, {threads} threads)": lambda: generate(model, ids, new),
                f"slmlab generate (plan compiled, {threads} threads)": lambda: generate(model, ids, new, compile=True),
            }
            anchors = llama_cpp_variants(model, tokenizer, prompt, new, threads, Path(folder)) if available() else {}
            t0 = time.perf_counter()
            block = generation_rows(hf, {**ours, **{name: fn for name, (fn, _) in anchors.items()}}, new, args.repeats,
                                    f"transformers LlamaForCausalLM.generate ({threads} threads)", clock=clock,
                                    first_call_timed=tuple(n for n in ours if "compiled" in n))
            outputs = {name: fn() for name, fn in ours.items()} | {name: fn() for name, (fn, _) in anchors.items()}
            outputs[block[0]["side"]] = hf()
            for row in block:
                tokens = outputs[row["side"]]
                tokens = tokens[0, len(prompt):].tolist() if torch.is_tensor(tokens) else tokens
                row["greedy = plan"] = agreement(reference, tokens)
            rows += block
            for _, engine in anchors.values():
                engine.close()
            print(f"{threads} threads: measured in {time.perf_counter() - t0:.0f} s")
    print_table(rows, f"Decode, batch 1, {new} greedy tokens (ratio: against transformers on the same threads)")


if __name__ == "__main__":
    main()
