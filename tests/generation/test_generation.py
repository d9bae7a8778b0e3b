"""The lean decode loop: sampling rules, stop tokens, streaming, pipeline interop."""

from __future__ import annotations

import logging

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, pipeline

import slmlab.generation.loop as loop
from slmlab.generation import COMPILED_PLAN, MODEL_FORWARD, PLAN, GeneratedTokens, SamplingConfig, generate, sample_next
from slmlab.models.lumen import LumenConfig, LumenForCausalLM


def tiny_model(vocab=64):
    torch.manual_seed(0)
    return LumenForCausalLM(LumenConfig(vocab_size=vocab, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=1, intermediate_dim=32)).eval()


def test_greedy_is_argmax_and_top_k_one_equals_greedy():
    logits = torch.randn(3, 50)
    assert torch.equal(sample_next(logits, SamplingConfig()), logits.argmax(-1))
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample_next(logits, SamplingConfig(temperature=1.0, top_k=1), g), logits.argmax(-1))


def test_top_k_and_top_p_restrict_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, -5.0, -6.0]])
    g = torch.Generator().manual_seed(0)
    draws = {int(sample_next(logits, SamplingConfig(temperature=1.0, top_k=2), g)) for _ in range(200)}
    assert draws == {0, 1}
    probs = logits.softmax(-1)[0]
    assert probs[0] < 0.8 < probs[0] + probs[1]
    draws = {int(sample_next(logits, SamplingConfig(temperature=1.0, top_p=0.8), g)) for _ in range(200)}
    assert draws == {0, 1}  # the token that crosses p is kept, the rest dropped


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_sampling_config_raises(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


def test_stop_tokens_and_streaming_callback():
    model = tiny_model()
    ids = torch.randint(0, 64, (1, 5))
    free = generate(model, ids, 10)
    stop = int(free[0, 7])  # the third generated token
    seen = []
    out = generate(model, ids, 10, stop_tokens=[stop], callback=lambda t: seen.append(int(t[0])))
    first = free[0, 5:].tolist().index(stop)
    assert out[0, 5:].tolist() == free[0, 5 : 5 + first + 1].tolist()
    assert seen == out[0, 5:].tolist()


def test_left_padded_batch_generation_equals_each_row_alone():
    model = tiny_model()
    a, b = torch.randint(0, 64, (7,)), torch.randint(0, 64, (4,))
    ids = torch.zeros(2, 7, dtype=torch.long)
    mask = torch.zeros(2, 7, dtype=torch.long)
    ids[0], mask[0] = a, 1
    ids[1, 3:], mask[1, 3:] = b, 1
    both = generate(model, ids, 6, attention_mask=mask)
    assert torch.equal(both[0, 7:], generate(model, a[None], 6)[0, 7:])
    assert torch.equal(both[1, 7:], generate(model, b[None], 6)[0, 4:])


def test_sampling_is_reproducible_with_a_generator():
    model = tiny_model()
    ids = torch.randint(0, 64, (2, 3))
    cfg = SamplingConfig(temperature=0.9, top_k=20, top_p=0.9)
    a = generate(model, ids, 8, cfg, generator=torch.Generator().manual_seed(3))
    b = generate(model, ids, 8, cfg, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)



@pytest.mark.parametrize(
    "kwargs, path, reason",
    [
        (dict(), PLAN, None),
        (dict(compile=True), COMPILED_PLAN, None),
        (dict(use_plan=False), MODEL_FORWARD, "use_plan=False"),
        (dict(attention_mask=torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])), MODEL_FORWARD, "padded batch"),
    ],
    ids=["plan", "compiled", "forward", "padded"],
)
def test_generate_reports_the_decode_path_in_its_result_and_a_debug_line(kwargs, path, reason, caplog, monkeypatch):
    # the compiled path's bookkeeping without a compile (the packaged step itself: test_packaged_step.py)
    monkeypatch.setattr(loop, "compiled_decoder", lambda plan: plan.step)
    model = tiny_model()
    ids = torch.randint(0, 64, (2, 5))
    with caplog.at_level(logging.DEBUG, logger="slmlab.generation"):
        out = generate(model, ids, 6, **kwargs)
    assert isinstance(out, GeneratedTokens) and out.decode_path == path
    lines = [r.getMessage() for r in caplog.records if r.name == "slmlab.generation"]
    assert len(lines) == 1 and f"through the {path}" in lines[0]
    assert lines[0].endswith(f"({reason})") if reason else "(" not in lines[0]
    ref = generate(model, ids, 6, use_plan=False, attention_mask=kwargs.get("attention_mask"))
    assert torch.equal(out, ref)


def test_the_result_is_an_ordinary_tensor_for_callers():
    model = tiny_model()
    ids = torch.randint(0, 64, (1, 5))
    out = generate(model, ids, 4)
    assert out.shape == (1, 9) and out.dtype == torch.long and isinstance(out, torch.Tensor)
    assert type(out[0, 5:]) is torch.Tensor and type(torch.cat([out, out])) is torch.Tensor  # ops give plain tensors
    assert out[0].tolist() == ids[0].tolist() + out[0, 5:].tolist()
    none = generate(model, ids, 0)
    assert torch.equal(none, ids) and none.decode_path is None


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate("<>|abcdefghijklmnopqrstuvwxyz ")}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="|"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<", eos_token=">", unk_token="|", pad_token="|")


def test_text_generation_pipeline():
    tok = char_tokenizer()
    model = tiny_model(vocab=len(tok))
    gen = pipeline("text-generation", model=model, tokenizer=tok)
    out = gen("hello", max_new_tokens=5, do_sample=False)
    text = out[0]["generated_text"]
    assert text.startswith("hello") and len(text) > len("hello")
