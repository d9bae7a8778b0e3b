"""The round trips that clients make with an exported model, run as they run them: in a process that
cannot import slmlab, on a `slmlab export --to hf` folder of every family.

1. load (``trust_remote_code`` where the folder ships code) -> ``save_pretrained`` -> load again: the
   same logits, the ``auto_map`` kept, and a client's extra config attribute kept;
2. peft: ``get_peft_model`` (all linear layers, random LoRA init) -> a few optimiser steps ->
   ``merge_and_unload`` equal to the adapter model (1e-5); a layer peft cannot merge correctly (NeoLLM's
   multiplied projections) is skipped by ``all-linear`` and refused by name;
3. trl: ``SFTTrainer`` runs a few steps on a conversational dataset unchanged (the export carries a
   chat template).

Skipped only when peft or trl is absent (both come with the test extras)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from no_slmlab import NO_SLMLAB
from test_export_hf import CASES, make_run

pytest.importorskip("peft")
pytest.importorskip("trl")

FAMILIES = ["lumen", "lfm2", "pgsm", "nanohammer", "neollm"]
MERGE_ATOL = 1e-5

CHILD = NO_SLMLAB + textwrap.dedent('''
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    jobs, out = json.loads(sys.argv[1]), {}

    def logits(model, ids):
        with torch.no_grad():
            return model(input_ids=ids).logits.float()

    def resave(job, ids):
        model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=job["remote"]).eval()
        before = logits(model, ids)
        model.config.client_tag = "kept"                       # what a client adds to a config
        model.save_pretrained(job["again"])
        saved = json.load(open(job["again"] + "/config.json"))
        again = AutoModelForCausalLM.from_pretrained(job["again"], trust_remote_code=job["remote"]).eval()
        config = AutoConfig.from_pretrained(job["again"], trust_remote_code=job["remote"])
        return {"auto_map": saved.get("auto_map"), "tag": getattr(config, "client_tag", None),
                "resave_diff": float((logits(again, ids) - before).abs().max())}

    def peft_merge(job, ids):
        import peft
        model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=job["remote"])
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
        adapted = peft.get_peft_model(model, config)
        lora_layers = sum(1 for n, _ in adapted.named_modules() if n.endswith("lora_A"))
        opt = torch.optim.SGD([p for p in adapted.parameters() if p.requires_grad], lr=1e-2)
        for _ in range(3):
            loss = adapted(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        adapted.eval()
        with_adapter = logits(adapted, ids)
        merged = adapted.merge_and_unload().eval()
        result = {"lora_layers": lora_layers,
                  "merge_diff": float((logits(merged, ids) - with_adapter).abs().max())}
        if job["refused_target"]:
            fresh = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=job["remote"])
            try:
                peft.get_peft_model(fresh, peft.LoraConfig(r=4, target_modules=[job["refused_target"]]))
                result["refusal"] = None
            except ValueError as err:
                result["refusal"] = str(err)[:300]
        return result

    def sft(job):
        from datasets import Dataset
        from peft import LoraConfig
        from trl import SFTConfig, SFTTrainer
        tok = AutoTokenizer.from_pretrained(job["folder"])
        model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=job["remote"])
        rows = [{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": w}]}
                for w in ("yes", "no", "maybe", "never")]
        args = SFTConfig(output_dir=job["sft_out"], max_steps=2, per_device_train_batch_size=2, report_to=[],
                         logging_steps=1, save_strategy="no", use_cpu=True, max_length=48, disable_tqdm=True)
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                             peft_config=LoraConfig(r=4, target_modules="all-linear"))
        trainer.train()
        losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
        return {"chat_template": bool(tok.chat_template), "sft_steps": trainer.state.global_step, "sft_losses": losses}

    for job in jobs:
        ids = torch.tensor([job["ids"]])
        result = {}
        for name, step in (("resave", lambda: resave(job, ids)), ("peft", lambda: peft_merge(job, ids)),
                           ("sft", lambda: sft(job))):
            try:
                result.update(step())
            except Exception as err:
                result[name + "_error"] = f"{type(err).__name__}: {str(err)[:1500]}"
        out[job["name"]] = result
    json.dump({"results": out, "slmlab_modules": sorted(m for m in sys.modules if m.startswith("slmlab"))},
              open(sys.argv[2], "w"))
''')


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """Every family exported, then the three client round trips in ONE fresh process without slmlab."""
    from slmlab import cli

    root = tmp_path_factory.mktemp("clients")
    native = {c[0]: c[4] for c in CASES}
    jobs = []
    for family in FAMILIES:
        run = make_run(root / f"run-{family}", family)
        folder = root / f"hf-{family}"
        assert cli.main(["export", str(run), "--to", "hf", str(folder)]) == 0
        jobs.append({"name": family, "folder": str(folder), "again": str(root / f"again-{family}"),
                     "sft_out": str(root / f"sft-{family}"), "remote": not native[family],
                     "ids": [84, 111, 32, 98, 101, 44, 32, 111, 114],
                     "refused_target": "q_proj" if family == "neollm" else None})
    env = {**os.environ, "HF_MODULES_CACHE": str(root / "hf-modules"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": "",
           "WANDB_DISABLED": "true", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs), str(root / "results.json")],
                          capture_output=True, text=True, env=env, cwd=root, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    child = json.loads((root / "results.json").read_text())
    assert child["slmlab_modules"] == []
    return {"jobs": {j["name"]: j for j in jobs}, "results": child["results"]}


def _ok(result: dict) -> dict:
    errors = {k: v for k, v in result.items() if k.endswith("_error")}
    assert not errors, errors
    return result


@pytest.mark.parametrize("family", FAMILIES)
def test_export_saved_again_by_a_client_loads_with_its_auto_map(client, family):
    result, job = _ok(client["results"][family]), client["jobs"][family]
    assert result["resave_diff"] <= 1e-6 and result["tag"] == "kept"
    if job["remote"]:
        first = json.loads(open(os.path.join(job["folder"], "config.json")).read())["auto_map"]
        assert result["auto_map"] == first and set(first) >= {"AutoConfig", "AutoModelForCausalLM"}


@pytest.mark.parametrize("family", FAMILIES)
def test_peft_merge_equals_the_adapter_model(client, family):
    result = _ok(client["results"][family])
    assert result["lora_layers"] >= 2  # peft adapted something: the check below compares two different paths
    assert result["merge_diff"] <= MERGE_ATOL


def test_peft_refuses_by_name_a_layer_it_cannot_merge(client):
    refusal = _ok(client["results"]["neollm"])["refusal"]
    assert refusal is not None and "not supported" in refusal and "RowMultipliedLinear" in refusal


@pytest.mark.parametrize("family", FAMILIES)
def test_trl_sft_runs_on_the_export_unchanged(client, family):
    result = _ok(client["results"][family])
    assert result["chat_template"] and result["sft_steps"] == 2
    assert len(result["sft_losses"]) == 2 and all(loss == loss and 0 < loss < 50 for loss in result["sft_losses"])
