"""End to end, for every registered family: a tiny run through ``slmlab train`` on generated text
and on each synthetic task, then ``slmlab eval``, ``slmlab generate``, and a reload of every
checkpoint in a fresh process giving the trained model's logits."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

import slmlab
from slmlab.commands.eval import eval_command
from slmlab.commands.generate import generate_command
from slmlab.commands.train import train_command
from slmlab.data import TASKS
from slmlab.train.checkpoint import load_model_weights, resolve_checkpoint

pytestmark = pytest.mark.slow  # ~2 min on 2 shared cores: trains families x data sets

FAMILIES = sorted(slmlab.families())
# one spec per task class (TASKS also holds aliases), shrunk to a few hundred examples
TASK_SPECS = sorted({cls: f"{name}:cpu,n_train=64,n_test=8" for name, cls in sorted(TASKS.items(), reverse=True)}.values())


def smallest_preset(family) -> str:
    """The family's preset with the fewest parameters (counted on the meta device)."""
    def count(preset):
        with torch.device("meta"):
            return sum(p.numel() for p in family.model_class(family.make_config(preset)).parameters())

    return min(family.presets, key=count) if family.presets else family.name


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    words = "thou art the king and queen of dust wind fire über straße naïve 東京".split()
    for split_name, n in (("a", 300), ("b", 300), ("c", 300)):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(n)]
        (folder / f"{split_name}.txt").write_text("\n".join(lines), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """Train every (family, data) pair for 3 steps; remember the trained logits of one batch."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name in FAMILIES:
        fam = slmlab.get_family(name)
        spec = f"{name}:{smallest_preset(fam)}" if fam.presets else name
        for data in ["text", *TASK_SPECS]:
            run_dir = root / f"{name}-{data.split(':')[0]}"
            source = str(corpus) if data == "text" else data
            argv = ["--model", spec, "--data", source, "--out", str(run_dir), "--steps", "3", "batch_size=4",
                    "eval_every=0", "eval_batches=1", "checkpoint_every=0", "progress=false", "tensorboard=false",
                    "vocab_size=320", "block_size=32", f"data_cache={root / 'cache'}", "sample_tokens=4"]
            assert train_command(argv) == 0
            report = json.loads((run_dir / "report.json").read_text())
            out[(name, data)] = (run_dir, report)
    return out


def test_every_run_trained_and_reported(runs):
    assert {k[0] for k in runs} == set(FAMILIES) and len(runs) == len(FAMILIES) * (1 + len(TASK_SPECS))
    for (name, data), (run_dir, report) in runs.items():
        assert report["steps"] == 3 and report["model_type"] == slmlab.get_family(name).config_class.model_type
        ev = report["final_eval"]
        assert ev["loss"] > 0 and 0.0 <= ev["acc"] <= 1.0
        if data == "text":
            assert ev["bits_per_byte"] > 0 and isinstance(report["sample"], str)
        else:
            assert "bits_per_byte" not in ev and ev["acc_by_group"]
        assert (resolve_checkpoint(run_dir) / "model.safetensors").is_file()


def test_eval_command_matches_the_run(runs, capsys):
    for (name, data), (run_dir, report) in runs.items():
        capsys.readouterr()
        subset = [] if data == "text" else ["--max-batches", "1"]  # text reports measure the whole split at the end
        assert eval_command([str(run_dir), *subset, "--batch-size", "4", "--json"]) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert result["loss"] == pytest.approx(report["final_eval"]["loss"], rel=1e-5), (name, data)


def test_generate_command_streams_for_every_family(runs, capsys):
    for (_name, data), (run_dir, _) in runs.items():
        capsys.readouterr()
        if data == "text":
            assert generate_command([str(run_dir), "--prompt", "thou art", "--max-new-tokens", "5", "--seed", "1"]) == 0
            assert capsys.readouterr().out.startswith("thou art")
        else:
            assert generate_command([str(run_dir), "--prompt-ids", "4,5,6", "--max-new-tokens", "3", "--temperature", "0"]) == 0
            assert len(capsys.readouterr().out.split()) == 3


RELOAD = textwrap.dedent(
    """
    import json, sys
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    import slmlab
    worst = 0.0
    for item in json.loads(open(sys.argv[1]).read()):
        ref = load_file(item["tensors"])
        model = AutoModelForCausalLM.from_pretrained(item["checkpoint"]).eval()
        with torch.no_grad():
            got = model(input_ids=ref["input_ids"]).logits
        worst = max(worst, float((got - ref["logits"]).abs().max()))
    print(json.dumps({"max_abs_diff": worst}))
    """
)


def test_checkpoints_reload_in_a_fresh_process(runs, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    items = []
    for i, (run_dir, _) in enumerate(runs.values()):
        ckpt = resolve_checkpoint(run_dir)
        # the reference: a normally built model (not from_pretrained's meta-device path) with the weights
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(ckpt)))
        load_model_weights(model, ckpt)
        model.eval()
        ids = torch.randint(0, min(model.config.vocab_size, 256), (2, 16), generator=torch.Generator().manual_seed(i))
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        path = tmp_path / f"{i}.safetensors"
        save_file({"input_ids": ids, "logits": logits.contiguous()}, str(path))
        items.append({"checkpoint": str(ckpt), "tensors": str(path)})
    (tmp_path / "items.json").write_text(json.dumps(items))
    (tmp_path / "reload.py").write_text(RELOAD)
    proc = subprocess.run([sys.executable, str(tmp_path / "reload.py"), str(tmp_path / "items.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["max_abs_diff"] <= 1e-5
