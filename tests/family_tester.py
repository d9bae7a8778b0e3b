"""One shared suite every family's test file reuses (transformers' causal_lm_tester pattern).

A family test module subclasses :class:`FamilyTester` and sets ``family`` and ``config_kwargs`` (a
tiny config); it may override ``forward_kwargs`` for family-specific inputs, and add its own tests.
Tolerances are fp32-tight (1e-5) everywhere.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.modeling_layers import GradientCheckpointingLayer

import slmlab
from slmlab.generation import COMPILED_PLAN, MODEL_FORWARD, PLAN, SamplingConfig, build_plan, compiled_step, generate

ATOL = 1e-5


def left_pad(batch: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad 1-D id tensors into ``ids [B, T]`` and ``attention_mask [B, T]``."""
    t = max(len(x) for x in batch)
    ids = torch.full((len(batch), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), t), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, t - len(x) :] = x
        mask[i, t - len(x) :] = 1
    return ids, mask


def decode_stepwise(model, ids, mask=None, prefill=1, **kw):
    """Prefill ``prefill`` tokens, then feed the rest one at a time; return all logits."""
    out = model(input_ids=ids[:, :prefill], attention_mask=None if mask is None else mask[:, :prefill], use_cache=True, **kw)
    logits, cache = [out.logits], out.cache
    for t in range(prefill, ids.shape[1]):
        out = model(
            input_ids=ids[:, t : t + 1],
            attention_mask=None if mask is None else mask[:, : t + 1],
            cache=cache,
            use_cache=True,
        )
        logits.append(out.logits)
        cache = out.cache
    return torch.cat(logits, dim=1)


# -- decode plans (used by FamilyTester when has_decode_plan, and by test_decode_plan.py) --------
def check_plan_steps(model, ids: torch.Tensor, prefill: int, step_fn=None) -> None:
    """Prefill ``ids[:, :prefill]``, then feed the rest one token at a time through the decode plan
    (``step_fn``: e.g. the compiled step) and through the model's own cache: logits agree at 1e-5."""
    with torch.inference_mode():
        plan = build_plan(model, ids.shape[1])
        plan.start(model(input_ids=ids[:, :prefill], use_cache=True).cache)
        # the model's own cache is a second, independent copy of the prompt
        ref_cache = model(input_ids=ids[:, :prefill], use_cache=True).cache
        position = torch.tensor([prefill])
        for t in range(prefill, ids.shape[1]):
            got = plan.step(ids[:, t : t + 1], position, step_fn)
            ref = model(input_ids=ids[:, t : t + 1], cache=ref_cache, use_cache=True).logits[:, -1]
            torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
            position += 1


def check_generate_paths_agree(model, ids: torch.Tensor, new: int) -> None:
    """``generate`` through the plan and through the model's forward give the same tokens, greedy
    and sampled with the same generator, and each reports the path it took."""
    planned, forward = generate(model, ids, new), generate(model, ids, new, use_plan=False)
    assert (planned.decode_path, forward.decode_path) == (PLAN, MODEL_FORWARD)
    assert torch.equal(planned, forward)
    sampling = SamplingConfig(temperature=0.9, top_k=20)
    a = generate(model, ids, new, sampling, generator=torch.Generator().manual_seed(3))
    b = generate(model, ids, new, sampling, generator=torch.Generator().manual_seed(3), use_plan=False)
    assert torch.equal(a, b)


def common_bad_inputs(model) -> list[tuple[dict, type, str]]:
    """Inputs every family refuses with the same actionable error: ``(forward kwargs, error, regex)``."""
    n, field = model.max_positions(), type(model.config).attribute_map.get("max_position_embeddings", "max_position_embeddings")
    ids = torch.zeros(1, 4, dtype=torch.long)
    return [
        (dict(input_ids=torch.zeros(1, n + 1, dtype=torch.long)), ValueError, rf"exceeds {field}={n}"),
        (dict(input_ids=torch.zeros(1, 4)), TypeError, "integer tensor"),
        (dict(input_ids=torch.zeros(4, dtype=torch.long)), ValueError, r"shape \[batch, seq_len\]"),
        (dict(input_ids=torch.full((1, 4), -1)), ValueError, "outside the vocabulary"),
        (dict(input_ids=ids, attention_mask=torch.ones(1, 5)), ValueError, "attention_mask must have shape"),
        (dict(inputs_embeds=torch.zeros(1, 4, 7)), ValueError, "inputs_embeds must have shape"),
        (dict(), ValueError, "exactly one of input_ids or inputs_embeds"),
        (dict(input_ids=torch.zeros(0, 4, dtype=torch.long)), ValueError, "empty batch"),
        (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), ValueError, "empty sequence"),
        (dict(input_ids=ids, labels=torch.zeros(1, 3, dtype=torch.long)), ValueError, "labels must have the inputs' shape"),
        (dict(input_ids=ids, labels=torch.full((1, 4), model.config.vocab_size)), ValueError, "label .* outside the vocabulary"),
        (dict(input_ids=ids, labels=torch.full((1, 4), -5)), ValueError, "label -5 is outside the vocabulary"),
        (dict(input_ids=ids, position_ids=torch.arange(3)[None]), ValueError, "position_ids must have shape"),
        (dict(input_ids=ids, position_ids=torch.arange(4)), ValueError, "position_ids must have shape"),
    ]


class FamilyTester:
    """The shared suite. Tables a family fills (each row becomes a check of the shared tests):

    * ``bad_configs``: ``(config overrides on config_kwargs, regex)``: the config raises ``ValueError``.
    * ``bad_inputs``: ``(forward kwargs, error type, regex)``: family-specific refusals, checked
      after :func:`common_bad_inputs`; ``skip_common_bad_inputs`` names regexes of common rows
      a family answers differently (and tests itself).
    """

    family: str = ""
    config_kwargs: dict = {}
    seq_len: int = 12
    bad_configs: list[tuple[dict, str]] = []
    bad_inputs: list[tuple[dict, type, str]] = []
    skip_common_bad_inputs: tuple[str, ...] = ()
    has_decode_plan: bool = False  # True: the family has a decode plan, and the plan tests below run

    # -- hooks -------------------------------------------------------------------------------
    def make_config(self, **overrides):
        return slmlab.get_family(self.family).config_class(**{**self.config_kwargs, **overrides})

    def make_model(self, **overrides):
        torch.manual_seed(0)
        cfg = self.make_config(**overrides)
        return slmlab.get_family(self.family).model_class(cfg).eval()

    def forward_kwargs(self, ids: torch.Tensor) -> dict:
        return {}

    def random_ids(self, model, b=2, t=None):
        return torch.randint(1, model.config.vocab_size, (b, t or self.seq_len))

    # -- tests -------------------------------------------------------------------------------
    def test_registered_with_auto_classes(self):
        model = self.make_model()
        cfg = AutoConfig.for_model(model.config.model_type, **self.config_kwargs)
        assert type(cfg) is type(model.config)
        assert type(AutoModelForCausalLM.from_config(cfg)) is type(model)

    def test_forward_shapes_and_loss(self):
        model = self.make_model()
        ids = self.random_ids(model)
        out = model(input_ids=ids, labels=ids, **self.forward_kwargs(ids))
        assert out.logits.shape == (*ids.shape, model.config.vocab_size)
        assert out.loss.ndim == 0 and torch.isfinite(out.loss)

    def test_labels_minus_100_are_ignored(self):
        model = self.make_model()
        ids = self.random_ids(model)
        labels = ids.clone()
        labels[:, : self.seq_len // 2] = -100
        out = model(input_ids=ids, labels=labels, **self.forward_kwargs(ids))
        logits = out.logits[:, self.seq_len // 2 - 1 : -1]
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, self.seq_len // 2 :].reshape(-1))
        torch.testing.assert_close(out.loss, ref, atol=ATOL, rtol=0)

    def test_scored_only_equals_the_full_logit_loss_and_gradients(self):
        model = self.make_model().train()
        ids = self.random_ids(model)
        labels = torch.full_like(ids, -100)
        labels[:, 3::4] = ids[:, 3::4]  # a few scored positions, as a synthetic task has
        losses, grads = [], []
        for scored_only in (False, True):
            model.zero_grad()
            torch.manual_seed(1)  # the same dropout masks for both paths
            out = model(input_ids=ids, labels=labels, scored_only=scored_only, **self.forward_kwargs(ids))
            out.loss.backward()
            losses.append(out.loss.detach())
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        assert out.logits.shape == (int((labels[:, 1:] != -100).sum()), model.config.vocab_size)
        torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=0)
        assert grads[0].keys() == grads[1].keys()
        for name, grad in grads[0].items():
            torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=0, msg=name)

    def test_gradient_reaches_every_parameter(self):
        model = self.make_model().train()
        ids = self.random_ids(model)
        model(input_ids=ids, labels=ids, **self.forward_kwargs(ids)).loss.backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
        assert not missing, f"no gradient for {missing}"

    def test_training_after_inference_mode_reaches_every_parameter(self):
        """Tables a module caches on first use (RoPE, Hadamard, fused weights) must not be inference tensors
        when that first use ran under ``torch.inference_mode`` (generation, serving, evaluation)."""
        model = self.make_model()
        ids = self.random_ids(model)
        with torch.inference_mode():
            model(input_ids=ids, **self.forward_kwargs(ids))
            model(input_ids=ids, use_cache=True, **self.forward_kwargs(ids))
        model.train()
        model(input_ids=ids, labels=ids, **self.forward_kwargs(ids)).loss.backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
        assert not missing, f"no gradient for {missing}"

    def test_gradient_checkpointing_equals_the_plain_backward(self):
        """Every decoder layer is a checkpointing layer; with checkpointing on (use_reentrant=False) the
        layers run again in backward, and the loss and every gradient equal the plain backward (1e-6)."""
        model = self.make_model().train()
        ids = self.random_ids(model)
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        assert len(layers) >= model.config.num_hidden_layers
        calls, counts = [], []
        for sub in list(layers[0].modules())[1:]:  # the first layer's submodules run once per pass over it
            sub.register_forward_hook(lambda *_: calls.append(1))
        losses, grads = [], []
        for checkpointed in (False, True):
            if checkpointed:
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
                assert model.is_activation_checkpointing and all(m.gradient_checkpointing for m in layers)
            model.zero_grad()
            calls.clear()
            torch.manual_seed(1)  # the same dropout masks in both runs (the recompute restores the RNG state)
            out = model(input_ids=ids, labels=ids, **self.forward_kwargs(ids))
            out.loss.backward()
            counts.append(len(calls))
            losses.append(out.loss.detach())
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        assert 0 < counts[0] < counts[1]  # checkpointed: the layer ran again (up to what backward needs)
        assert out.cache is None  # a checkpointed training forward keeps no cache
        torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=0)
        assert grads[0].keys() == grads[1].keys() and grads[0]
        for name, grad in grads[0].items():
            torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=0, msg=name)
        model.activation_checkpointing_disable()
        assert not any(m.gradient_checkpointing for m in layers)

    def test_return_dict_false_is_the_outputs_to_tuple(self):
        """``return_dict=False`` returns exactly ``ModelOutput.to_tuple()``, for the causal LM and its base model."""
        model = self.make_model()
        ids = self.random_ids(model)
        kw = self.forward_kwargs(ids)
        for module, extra in ((model, dict(labels=ids)), (model.model, {})):
            as_dict = module(input_ids=ids, **extra, **kw).to_tuple()
            as_tuple = module(input_ids=ids, return_dict=False, **extra, **kw)
            assert type(as_tuple) is tuple and len(as_tuple) == len(as_dict)
            for got, want in zip(as_tuple, as_dict):
                assert type(got) is type(want)
                if isinstance(want, torch.Tensor):
                    torch.testing.assert_close(got, want, atol=0, rtol=0)

    def test_auto_model_round_trip(self, tmp_path):
        """``AutoModel`` builds the base model from the config and loads it back from a folder."""
        model = self.make_model()
        base = AutoModel.from_config(model.config)
        assert type(base) is type(model).base_model_class
        model.model.save_pretrained(tmp_path)
        again = AutoModel.from_pretrained(tmp_path).eval()
        assert type(again) is type(model.model)
        ids = self.random_ids(model)
        kw = self.forward_kwargs(ids)
        with torch.no_grad():
            torch.testing.assert_close(
                again(input_ids=ids, **kw).last_hidden_state, model.model(input_ids=ids, **kw).last_hidden_state, atol=ATOL, rtol=0
            )

    def test_causality(self):
        model = self.make_model()
        ids = self.random_ids(model)
        cut = self.seq_len // 2
        other = ids.clone()
        other[:, cut:] = torch.randint(1, model.config.vocab_size, other[:, cut:].shape)
        a = model(input_ids=ids, **self.forward_kwargs(ids)).logits[:, :cut]
        b = model(input_ids=other, **self.forward_kwargs(other)).logits[:, :cut]
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)

    @pytest.mark.parametrize("prefill", [1, 5])
    def test_decode_equals_prefill(self, prefill):
        model = self.make_model()
        ids = self.random_ids(model)
        kw = self.forward_kwargs(ids)
        full = model(input_ids=ids, use_cache=False, **kw).logits
        step = decode_stepwise(model, ids, prefill=prefill, **kw)
        torch.testing.assert_close(step, full, atol=ATOL, rtol=0)

    def test_decode_equals_prefill_left_padded(self):
        model = self.make_model()
        rows = [torch.randint(1, model.config.vocab_size, (n,)) for n in (self.seq_len, self.seq_len - 4, self.seq_len - 7)]
        ids, mask = left_pad(rows)
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        step = decode_stepwise(model, ids, mask, prefill=self.seq_len - 6)
        real = mask.bool()
        torch.testing.assert_close(step[real], full[real], atol=ATOL, rtol=0)
        # each padded row equals the same sequence run alone, unpadded
        for i, row in enumerate(rows):
            alone = model(input_ids=row[None], use_cache=False).logits[0]
            torch.testing.assert_close(full[i, -len(row) :], alone, atol=ATOL, rtol=0)

    def test_generate_matches_lean_loop(self):
        model = self.make_model()
        ids = self.random_ids(model, b=1, t=6)
        ours = generate(model, ids, 8)
        hf = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert torch.equal(ours, hf)
        sampled = model.generate(ids, max_new_tokens=4, do_sample=True, top_k=5, min_new_tokens=4)
        assert sampled.shape == (1, 10)

    def num_hidden_states(self, model) -> int:
        """Entries of ``output_hidden_states``: the embeddings plus one per layer."""
        return model.config.num_hidden_layers + 1

    def test_output_hidden_states(self):
        model = self.make_model()
        ids = self.random_ids(model)
        kw = self.forward_kwargs(ids)
        out = model(input_ids=ids, output_hidden_states=True, **kw)
        states = out.hidden_states
        assert isinstance(states, tuple) and len(states) == self.num_hidden_states(model)
        assert all(h.shape == (*ids.shape, model.config.hidden_size) for h in states)
        torch.testing.assert_close(states[0], model.model.embed(ids), atol=0, rtol=0)
        torch.testing.assert_close(states[-1], model.model(input_ids=ids, **kw).last_hidden_state, atol=ATOL, rtol=0)
        torch.testing.assert_close(model.lm_head(states[-1]), out.logits, atol=ATOL, rtol=0)
        assert model(input_ids=ids, **kw).hidden_states is None
        # decoding: a step's hidden states are the full forward's at that position, layer by layer
        cut = self.seq_len - 1
        first = model(input_ids=ids[:, :cut], use_cache=True, **kw)
        step = model(input_ids=ids[:, cut:], cache=first.cache, use_cache=True, output_hidden_states=True)
        for got, ref in zip(step.hidden_states, states, strict=True):
            torch.testing.assert_close(got, ref[:, cut:], atol=ATOL, rtol=0)

    # -- transformers compatibility: attentions, continuing from a cache, assisted decoding ---------
    supports_assisted_decoding: bool = False  # True: the cache can be rolled back (crop), so drafts work
    draft_overrides: dict = {}  # config overrides on config_kwargs for the smaller draft model

    def attention_shapes(self, model, b: int, t: int, s: int) -> list[tuple[int, ...]]:
        """Shapes of ``output_attentions`` for ``t`` queries over ``s`` tokens (cached + new): one
        ``[B, H, T, S]`` per attention layer, in layer order. Families with other layouts override."""
        return [(b, model.config.num_attention_heads, t, s)] * model.config.num_hidden_layers

    def test_output_attentions(self):
        model = self.make_model()
        ids = self.random_ids(model)
        kw = self.forward_kwargs(ids)
        b, t = ids.shape
        out = model(input_ids=ids, output_attentions=True, **kw)
        assert isinstance(out.attentions, tuple)
        assert [tuple(a.shape) for a in out.attentions] == self.attention_shapes(model, b, t, t)
        assert all(torch.isfinite(a).all() for a in out.attentions)
        plain = model(input_ids=ids, **kw)
        assert plain.attentions is None
        torch.testing.assert_close(out.logits, plain.logits, atol=ATOL, rtol=0)  # the eager path is the same function
        # decoding: a step's weights are the full forward's rows of that token, over every cached key
        first = model(input_ids=ids[:, :-1], use_cache=True, **kw)
        step = model(input_ids=ids[:, -1:], cache=first.cache, use_cache=True, output_attentions=True)
        assert [tuple(a.shape) for a in step.attentions] == self.attention_shapes(model, b, 1, t)
        for got, ref in zip(step.attentions, out.attentions, strict=True):
            torch.testing.assert_close(got, ref[:, :, ref.shape[2] - got.shape[2] :], atol=ATOL, rtol=0)

    def test_generate_returns_attentions_and_hidden_states(self):
        model = self.make_model()
        ids = self.random_ids(model, b=1, t=6)
        kw = self.forward_kwargs(ids)
        out = model.generate(
            ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, return_dict_in_generate=True,
            output_attentions=True, output_hidden_states=True, **kw,
        )
        assert len(out.attentions) == len(out.hidden_states) == 4
        for i, (attentions, states) in enumerate(zip(out.attentions, out.hidden_states, strict=True)):
            q = 6 if i == 0 else 1
            assert [tuple(a.shape) for a in attentions] == self.attention_shapes(model, 1, q, 6 + i)
            assert len(states) == self.num_hidden_states(model)
            assert all(h.shape == (1, q, model.config.hidden_size) for h in states)
        # the last step's outputs are a forward over the sequence's rows of that token
        full = model(input_ids=out.sequences[:, :-1], output_attentions=True, output_hidden_states=True, **kw)
        for got, ref in zip(out.attentions[-1], full.attentions, strict=True):
            torch.testing.assert_close(got, ref[:, :, ref.shape[2] - got.shape[2] :], atol=ATOL, rtol=0)
        for got, ref in zip(out.hidden_states[-1], full.hidden_states, strict=True):
            torch.testing.assert_close(got, ref[:, -1:], atol=ATOL, rtol=0)

    def test_generate_continues_from_a_returned_cache(self):
        model = self.make_model()
        ids = self.random_ids(model, b=1, t=6)
        kw = self.forward_kwargs(ids)
        greedy = dict(do_sample=False, **kw)
        first = model.generate(ids, max_new_tokens=5, min_new_tokens=5, return_dict_in_generate=True, **greedy)
        assert first.cache.get_seq_length() == 10  # the last token is not fed yet
        more = model.generate(first.sequences, cache=first.cache, max_new_tokens=5, min_new_tokens=5, **greedy)
        assert torch.equal(more, model.generate(ids, max_new_tokens=10, min_new_tokens=10, **greedy))
        # a second turn: new tokens after the answer go through the cache as one chunk
        first = model.generate(ids, max_new_tokens=5, min_new_tokens=5, return_dict_in_generate=True, **greedy)
        turn = torch.cat((first.sequences, self.random_ids(model, b=1, t=4)), dim=1)
        with pytest.warns(FutureWarning, match="past_key_values"):  # transformers' older name still works
            again = model.generate(turn, past_key_values=first.cache, max_new_tokens=4, min_new_tokens=4, **greedy)
        assert torch.equal(again, model.generate(turn, max_new_tokens=4, min_new_tokens=4, **greedy))

    def test_assisted_and_prompt_lookup_decoding_equal_greedy_or_are_refused(self):
        model = self.make_model()
        draft = self.make_model(**self.draft_overrides)
        with torch.no_grad():  # a draft that often disagrees, so verification rejects and rolls back tokens
            generator = torch.Generator().manual_seed(1)
            for p in draft.parameters():
                p.add_(0.5 * torch.randn(p.shape, generator=generator))
        assert sum(p.numel() for p in draft.parameters()) <= sum(p.numel() for p in model.parameters())
        ids = self.random_ids(model, b=1, t=6)
        greedy = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
        expected = model.generate(ids, **greedy)
        for extra in (dict(assistant_model=draft), dict(prompt_lookup_num_tokens=3)):
            if self.supports_assisted_decoding:
                assert torch.equal(model.generate(ids, **greedy, **extra), expected), extra
            else:
                with pytest.raises(ValueError, match="cannot be"):
                    model.generate(ids, **greedy, **extra)
        if self.supports_assisted_decoding:
            assert not torch.equal(draft.generate(ids, **greedy), expected)
        else:
            assert model.crop_refusal() is not None

    def test_static_cache_is_refused_naming_the_decode_plans(self):
        model = self.make_model()
        ids = self.random_ids(model, b=1, t=4)
        with pytest.raises(ValueError, match=r"cache_implementation='static' is not supported.*slmlab\.generation's decode plans"):
            model.generate(ids, max_new_tokens=2, cache_implementation="static")

    def test_bad_configs_raise(self):
        for overrides, match in self.bad_configs:
            with pytest.raises(ValueError, match=match):
                self.make_config(**overrides)

    def test_bad_inputs_raise_actionable_errors(self):
        model = self.make_model()
        common = [row for row in common_bad_inputs(model) if row[2] not in self.skip_common_bad_inputs]
        for kwargs, error, match in common + list(self.bad_inputs):
            with pytest.raises(error, match=match):
                model(**kwargs)

    def test_bad_token_id_raises(self):
        model = self.make_model()
        ids = self.random_ids(model)
        ids[0, 0] = model.config.vocab_size
        with pytest.raises(ValueError, match="outside the vocabulary"):
            model(input_ids=ids)

    # -- decode plans: every family reports its path; the rest runs where has_decode_plan ---------
    def test_generate_reports_its_decode_path(self, caplog):
        model = self.make_model()
        assert (build_plan(model, self.seq_len) is not None) == self.has_decode_plan, "set has_decode_plan"
        ids = self.random_ids(model, b=1, t=5)
        with caplog.at_level(logging.DEBUG, logger="slmlab.generation"):
            out = generate(model, ids, 3)
        assert out.decode_path == (PLAN if self.has_decode_plan else MODEL_FORWARD)
        assert f"through the {out.decode_path}" in caplog.text
        assert generate(model, ids, 3, use_plan=False).decode_path == MODEL_FORWARD

    def skip_without_decode_plan(self) -> None:
        if not self.has_decode_plan:
            pytest.skip(f"{self.family} has no decode plan")

    def test_plan_steps_equal_the_models_decode(self):
        self.skip_without_decode_plan()
        model = self.make_model()
        check_plan_steps(model, self.random_ids(model, b=2, t=20), prefill=7)

    def test_generate_through_the_plan_equals_generate_through_forward(self):
        self.skip_without_decode_plan()
        model = self.make_model()
        check_generate_paths_agree(model, self.random_ids(model, b=3, t=6), 25)

    def test_the_plan_is_built_per_call_so_it_sees_new_weights(self):
        self.skip_without_decode_plan()
        model = self.make_model()
        ids = self.random_ids(model, b=1, t=5)
        generate(model, ids, 10)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        assert torch.equal(generate(model, ids, 10), generate(model, ids, 10, use_plan=False))

    def test_generate_falls_back_where_the_plan_does_not_apply(self):
        self.skip_without_decode_plan()
        model = self.make_model()
        limit = model.max_positions()
        assert build_plan(model, limit + 1) is None  # beyond the model's length: its own error applies
        with pytest.raises(ValueError, match="exceeds"):
            generate(model, self.random_ids(model, b=1, t=limit - 4), 10)
        ids, mask = left_pad([torch.randint(1, model.config.vocab_size, (n,)) for n in (5, 8)])
        padded = generate(model, ids, 6, attention_mask=mask)
        assert padded.decode_path == MODEL_FORWARD
        assert torch.equal(padded, generate(model, ids, 6, attention_mask=mask, use_plan=False))

    def test_half_precision_models_decode_through_forward(self):
        self.skip_without_decode_plan()
        model = self.make_model().to(torch.bfloat16)
        assert build_plan(model, 16) is None  # no bfloat16 complex type for the plan's RoPE
        out = generate(model, self.random_ids(model, b=1, t=5), 4)
        assert out.shape == (1, 9) and out.decode_path == MODEL_FORWARD

    def test_a_prompt_that_fills_the_plan_is_refused(self):
        self.skip_without_decode_plan()
        model = self.make_model()
        with torch.inference_mode():
            cache = model(input_ids=self.random_ids(model, b=1, t=8), use_cache=True).cache
        with pytest.raises(ValueError, match="fills all 8 positions"):
            build_plan(model, 8).start(cache)

    @pytest.mark.slow  # torch.compile: ~10-20 s per model on a CPU
    def test_compiled_plan_steps_equal_the_models_decode(self):
        """Compiled, RoPE runs in real arithmetic (``rotate_pairs``); the logits must still agree."""
        self.skip_without_decode_plan()
        model = self.make_model()
        ids = self.random_ids(model, b=1, t=18)
        check_plan_steps(model, ids, prefill=6, step_fn=compiled_step(build_plan(model, 18)))
        compiled = generate(model, ids[:, :6], 12, compile=True)
        assert compiled.decode_path == COMPILED_PLAN
        assert torch.equal(compiled, generate(model, ids[:, :6], 12, use_plan=False))

    def test_save_load_round_trip_in_fresh_process(self, tmp_path):
        model = self.make_model()
        ids = self.random_ids(model)
        ref = model(input_ids=ids, **self.forward_kwargs(ids)).logits
        model.save_pretrained(tmp_path)
        assert (tmp_path / "model.safetensors").exists()
        torch.save({"ids": ids, "kw": self.forward_kwargs(ids)}, tmp_path / "inputs.pt")
        script = textwrap.dedent(
            f"""
            import json, torch, slmlab
            from transformers import AutoModelForCausalLM
            m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}).eval()
            d = torch.load({str(tmp_path / 'inputs.pt')!r}, weights_only=True)
            with torch.no_grad():
                out = m(input_ids=d["ids"], **d["kw"]).logits
            torch.save(out, {str(tmp_path / 'out.pt')!r})
            print(json.dumps({{"cls": type(m).__name__}}))
            """
        )
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout.strip().splitlines()[-1])["cls"] == type(model).__name__
        torch.testing.assert_close(torch.load(tmp_path / "out.pt", weights_only=True), ref, atol=ATOL, rtol=0)
