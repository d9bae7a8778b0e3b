"""Fine-tuning on chat data, full and LoRA, for every family (src/slmlab/train/finetune.py, lora.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from serve_helpers import TINY, build_checkpoint
from slmlab.data.chat_data import builtin_chat, write_chat_jsonl
from slmlab.data.chat_source import ChatSource
from slmlab.data.tokenizers import byte_tokenizer
from slmlab.models.registry import get_family
from slmlab.train.checkpoint import resolve_checkpoint
from slmlab.train.config import load_config
from slmlab.train.finetune import LoraTrainer, build_finetune_trainer, write_merged
from slmlab.train.lora import LoraSpec, add_lora, merge_adapter, parse_lora_spec, target_modules, trainable_share
from slmlab.train.run import attach_tokenizer
from slmlab.train.saved import load_for_inference
from slmlab.train.session import FINETUNE, RunSession

pytest.importorskip("peft")

ATOL = 1e-5
FAMILIES = sorted(TINY)
SPEC = LoraSpec(r=4, alpha=8.0)


def tiny_model(family: str, seed: int = 0):
    """The family's tiny test model on the byte tokenizer's ids, its tokenizer tables filled."""
    fam = get_family(family)
    preset = f"{family}-tiny" if TINY[family] is None else None
    torch.manual_seed(seed)
    model = fam.model_class(fam.make_config(preset, vocab_size=259, **(TINY[family] or {})))
    attach_tokenizer(model, byte_tokenizer())
    return model.eval()


def randomize_adapters(peft_model, seed: int = 1) -> None:
    """Non-zero ``B`` in every adapter (a fresh one starts at ``B = 0``, equal to the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def sample_ids(seed: int = 0, shape=(2, 24)) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_adapter_forward_equals_merged_forward(family):
    model = tiny_model(family)
    ids = sample_ids()
    # PGSM's retriever runs where the batch asks for retrieval: ask, so its projections are on the path
    extra = {"retrieval_positions": torch.tensor([[5, 23], [9, 23]])} if get_family(family).extra_forward_inputs else {}
    with torch.no_grad():
        base = model(input_ids=ids, **extra).logits
    names = target_modules(model)
    assert names and all(n.rsplit(".", 1)[-1] in get_family(family).lora_targets for n in names)
    peft_model = add_lora(model, SPEC)
    randomize_adapters(peft_model)
    assert {n.rsplit(".lora_A", 1)[0] for n, _ in peft_model.get_base_model().named_parameters() if ".lora_A" in n} == set(names)
    # every adapted layer is on the forward path (a fused projection reading .weight would skip it)
    peft_model.train()
    peft_model(input_ids=ids, labels=ids, **extra).loss.backward()
    dead = [n for n, p in peft_model.named_parameters() if "lora_" in n and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert not dead
    peft_model.eval()
    with torch.no_grad():
        adapted = peft_model(input_ids=ids, **extra).logits
        merged = merge_adapter(copy.deepcopy(peft_model))(input_ids=ids, **extra).logits
    assert (adapted - base).abs().max() > 1e-3  # the adapter changes the model
    torch.testing.assert_close(merged, adapted, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_tokens_get_no_loss(family):
    """The batch loss is the mean cross entropy of the assistant's tokens only, each row computed alone
    (no padding): prompt, role tags and padding add nothing, and right padding changes no logit."""
    model = tiny_model(family)
    tok = byte_tokenizer()
    conversations = builtin_chat(20)
    source = ChatSource("builtin:chat", conversations, tok, 256)
    batch = next(source.eval_batches("train", 6))
    with torch.no_grad():
        loss = model(**batch).loss
        nll, count = 0.0, 0
        for ids, scored in source.rows["train"][:6]:
            row = torch.from_numpy(ids)[None]
            logits = model(input_ids=row).logits[0, :-1]
            target = torch.from_numpy(ids[1:])
            keep = torch.from_numpy(scored[1:])
            nll += F.cross_entropy(logits[keep], target[keep], reduction="sum")
            count += int(keep.sum())
            assert 0 < int(keep.sum()) < len(ids) - 1
    torch.testing.assert_close(loss, torch.as_tensor(nll / count), atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def chat_file(tmp_path_factory):
    return write_chat_jsonl(builtin_chat(40), tmp_path_factory.mktemp("chat") / "chat.jsonl")


def finetune_cfg(base, data, out, *extra):
    return load_config([], [f"model={base}", f"data={data}", f"out_dir={out}", f"tokenizer={base}", "max_steps=4",
                            "batch_size=2", "eval_every=0", "eval_batches=2", "checkpoint_every=2", "keep_checkpoints=0",
                            "progress=false", "tensorboard=false", "sample_tokens=0", "block_size=160", "device=cpu",
                            "optim.lr=0.02", "optim.weight_decay=0", "schedule.warmup=1", *extra])


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, chat_file):
    """Per family, on first use: a saved base model and a 4-step LoRA fine-tune of it (checkpoints at 2 and 4),
    with the parameters before and after training."""
    runs = {}

    def get(family):
        if family not in runs:
            root = tmp_path_factory.mktemp(f"ft-{family}")
            base = build_checkpoint(family, root / "base")
            trainer = build_finetune_trainer(finetune_cfg(base, chat_file, root / "lora"), SPEC)
            before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
            trainer.train()
            runs[family] = dict(root=root, base=base, trainer=trainer, before=before)
        return runs[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_training_changes_only_the_adapter(family, lora_runs):
    run = lora_runs(family)
    trainer = run["trainer"]
    assert isinstance(trainer, LoraTrainer)
    trainable, total = trainable_share(trainer.model)
    assert 0 < trainable < total / 2
    after = dict(trainer.model.named_parameters())
    changed = {name for name, old in run["before"].items() if not torch.equal(old, after[name].detach())}
    assert changed and all("lora_" in name for name in changed)  # adapter weights moved, nothing else did
    # every adapter on the chat forward path moved (PGSM's retrieval path runs only where a batch asks for it)
    assert {n for n in run["before"] if "lora_" in n and "retriev" not in n} <= changed
    ckpt = resolve_checkpoint(run["root"] / "lora")
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "model.safetensors").exists()
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved)
    config = json.loads((ckpt / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["base_model_name_or_path"] == str(run["base"].resolve())


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_adapter_loads_equal_in_a_fresh_process(family, lora_runs, tmp_path):
    run = lora_runs(family)
    ckpt = resolve_checkpoint(run["root"] / "lora")
    ids = sample_ids(3)
    # the trained adapter, merged in this process (merged == adapter forward: the test above)
    merged_here = merge_adapter(copy.deepcopy(run["trainer"].peft_model)).eval()
    with torch.no_grad():
        want = merged_here(input_ids=ids).logits
    code = textwrap.dedent(f"""
        import torch
        from safetensors.torch import save_file
        from slmlab.train.saved import load_for_inference
        loaded = load_for_inference({str(ckpt)!r}, "cpu")
        ids = torch.tensor({ids.tolist()})
        with torch.no_grad():
            save_file({{"logits": loaded.model(input_ids=ids).logits.contiguous()}}, {str(tmp_path / "out.safetensors")!r})
        print(type(loaded.model).__name__, loaded.trained_context, loaded.tokenizer.chat_template is not None)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    name, context, has_template = out.stdout.split()
    assert name == type(run["trainer"].model).__name__ and context == "160" and has_template == "True"
    torch.testing.assert_close(load_file(str(tmp_path / "out.safetensors"))["logits"], want, atol=ATOL, rtol=0)
    merged = write_merged(ckpt, tmp_path / "merged")  # a plain checkpoint: the same model without peft
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    with torch.no_grad():
        torch.testing.assert_close(load_for_inference(merged, "cpu").model(input_ids=ids).logits, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_resume_is_exact(family, lora_runs, chat_file, tmp_path):
    run = lora_runs(family)
    full = run["trainer"]
    middle = run["root"] / "lora" / "checkpoints" / "step_000002"
    with RunSession(tmp_path / "again", FINETUNE, resume=middle) as session:
        resumed = build_finetune_trainer(finetune_cfg(run["base"], chat_file, tmp_path / "again"), SPEC, session=session)
    assert resumed.state.step == 2
    resumed.train()
    assert resumed.losses == full.losses[2:]  # bit-identical, every step
    final = dict(full.model.named_parameters())
    for name, p in resumed.model.named_parameters():
        assert torch.equal(p, final[name]), name


def test_full_finetune_resume_is_exact_and_trains_every_parameter(tmp_path, chat_file):
    base = build_checkpoint("lfm2", tmp_path / "base")
    full = build_finetune_trainer(finetune_cfg(base, chat_file, tmp_path / "full"))
    assert type(full).__name__ == "Trainer" and trainable_share(full.model)[0] == trainable_share(full.model)[1]
    full.train()
    ckpt = resolve_checkpoint(tmp_path / "full")
    assert (ckpt / "model.safetensors").is_file() and json.loads((ckpt / "finetune.json").read_text())["lora"] is None
    with RunSession(tmp_path / "again", FINETUNE, resume=tmp_path / "full" / "checkpoints" / "step_000002") as session:
        resumed = build_finetune_trainer(finetune_cfg(base, chat_file, tmp_path / "again"), session=session)
    resumed.train()
    assert resumed.losses == full.losses[2:]
    final = dict(full.model.named_parameters())
    assert all(torch.equal(p, final[n]) for n, p in resumed.model.named_parameters())


def test_resume_refuses_another_lora_spec_or_method(tmp_path, lora_runs, chat_file):
    run = lora_runs("lumen")
    middle = run["root"] / "lora" / "checkpoints" / "step_000002"
    with pytest.raises(ValueError, match="change the fine-tune's lora"), RunSession(tmp_path / "a", FINETUNE, middle) as session:
        build_finetune_trainer(finetune_cfg(run["base"], chat_file, tmp_path / "a"), LoraSpec(r=8), session=session)
    with pytest.raises(ValueError, match="change the fine-tune's lora"), RunSession(tmp_path / "b", FINETUNE, middle) as session:
        build_finetune_trainer(finetune_cfg(run["base"], chat_file, tmp_path / "b"), None, session=session)


def test_lora_spec_parsing():
    assert parse_lora_spec("") == LoraSpec()
    assert parse_lora_spec("r=16,alpha=32,dropout=0.1,targets=q_proj,v_proj") == LoraSpec(16, 32.0, 0.1, ("q_proj", "v_proj"))
    assert parse_lora_spec("targets=o_proj, r=2") == LoraSpec(r=2, targets=("o_proj",))
    for bad, message in (("r=0", "r > 0"), ("rank=4", "unknown key 'rank'"), ("q_proj", "not key=value"),
                         ("alpha=big", "not a number")):
        with pytest.raises(ValueError, match=message):
            parse_lora_spec(bad)


def test_lora_targets_are_plain_linear_layers_only():
    model = tiny_model("neollm")
    chosen = target_modules(model)
    modules = dict(model.named_modules())
    assert chosen and all(type(modules[n]) is torch.nn.Linear for n in chosen)
    skipped = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear})
    only_wrapped = [s for s in skipped if all(type(m) is not torch.nn.Linear for n, m in model.named_modules()
                                               if n.rsplit(".", 1)[-1] == s)]
    if only_wrapped:  # a multiplied linear would not merge exactly: named explicitly, it is refused
        with pytest.raises(ValueError, match="not plain nn.Linear"):
            target_modules(model, (only_wrapped[0],))
    assert target_modules(model, ("k_proj",)) == sorted(n for n in chosen if n.endswith(".k_proj"))
    with pytest.raises(ValueError, match="matches no module"):
        target_modules(model, ("nope",))
    with pytest.raises(ValueError, match="matches no module"):
        target_modules(tiny_model("lumen"), ("lm_head",))
