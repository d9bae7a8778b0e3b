"""`slmlab export --to hf`: every family loads in a process that cannot import slmlab, with slmlab's
logits and greedy tokens; checkpoints record eos/bos/pad and the trained context; bad input."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from family_tester import ATOL, left_pad
from no_slmlab import NO_SLMLAB
from slmlab import cli
from slmlab.data.tokenizers import byte_tokenizer
from slmlab.generation import SamplingConfig, generate
from slmlab.models import get_family
from slmlab.train.checkpoint import save_checkpoint
from slmlab.train.run import attach_tokenizer, record_tokenizer
from tiny_runs import train_tiny_run

VOCAB = 259  # the byte tokenizer: 256 bytes + <bos> <eos> <pad>
CONTEXT = 32
MAX_NEW = 8
TINY = {
    "lumen": dict(hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=48, max_seq_len=64),
    "lfm2": dict(hidden_size=32, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, num_layers=4,
                 layer_order=["conv", "attn", "conv", "attn"], block_multiple_of=16, max_position_embeddings=64),
    "pgsm": dict(block_size=64, dim=32, layers=2, hidden=48, kernel_size=5, retrieval_dim=16, retrieval_heads=2),
    "nanohammer": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, num_state_heads=3, state_hidden_size=12, max_position_embeddings=96,
                       bos_token_id=None, eos_token_id=None),
    "neollm": dict(),
}
PRESET = {"neollm": "neollm-tiny"}
# (name, family, config overrides, expected class, exported natively?)
CASES = [
    ("lumen", "lumen", {}, "LlamaForCausalLM", True),
    ("lfm2", "lfm2", {}, "Lfm2ForCausalLM", True),
    ("pgsm", "pgsm", {}, "PGSMForCausalLM", False),
    ("nanohammer", "nanohammer", {}, "NanoHammerForCausalLM", False),
    ("neollm", "neollm", {}, "NeoLLMForCausalLM", False),
    ("lumen-attention-only", "lumen", dict(intermediate_dim=0), "LumenForCausalLM", False),
    ("lfm2-conv-bias", "lfm2", dict(conv_bias=True), "Lfm2SmallForCausalLM", False),
]
PROMPT = [84, 111, 32, 98, 101, 44]  # "To be,"


def tiny_model(family: str, **overrides):
    fam = get_family(family)
    torch.manual_seed(0)
    config = fam.make_config(PRESET.get(family), **{**TINY[family], "vocab_size": VOCAB, **overrides})
    model = fam.model_class(config).eval()
    with torch.no_grad():  # larger weights than the init's: greedy tokens then vary instead of repeating
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return model


def greedy(model, prompt: list[int], eos: int | None = None) -> list[int]:
    out = generate(model, torch.tensor([prompt]), MAX_NEW, SamplingConfig(temperature=0.0),
                   stop_tokens=[eos] if eos is not None else [])
    return out[0].tolist()


def make_run(root: Path, family: str, overrides: dict | None = None, choose_eos: bool = True) -> Path:
    """A run folder as `slmlab train` leaves it (checkpoint, run.yaml, report.json), built in code.
    The tokenizer's eos is set to the token the model greedily emits third after PROMPT (the first
    new one), so greedy generation has an end-of-text to stop at."""
    model = tiny_model(family, **(overrides or {}))
    tok = byte_tokenizer()
    attach_tokenizer(model, tok)  # NeoLLM's Spelling Bee table
    if choose_eos:
        free = greedy(model, PROMPT)[len(PROMPT):]
        stop = next((t for i, t in enumerate(free) if i >= 2 and t not in free[:i] and t not in PROMPT), free[0])
        tok.eos_token = tok.convert_ids_to_tokens(stop)
    record_tokenizer(model, tok, CONTEXT)
    run_config = {"model": family, "data": "corpus", "tokenizer": "byte", "block_size": CONTEXT}
    ckpt = save_checkpoint(root / "checkpoints", 3, model, tok, torch.optim.AdamW(model.parameters()),
                           {"step": 3, "tokens_seen": 3 * 2 * CONTEXT}, run_config)
    report = {"checkpoint": str(ckpt), "final_eval": {"loss": 5.25, "bits_per_byte": 2.125, "tokens": 62}}
    (root / "report.json").write_text(json.dumps(report))
    return root


CHILD = NO_SLMLAB + textwrap.dedent('''
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    torch.set_num_threads(1)
    jobs, results, logits = json.loads(sys.argv[1]), {}, {}
    def run(job):
        folder = job["folder"]
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=job["remote"]).eval()
        tok = AutoTokenizer.from_pretrained(folder)
        ids, mask = torch.tensor(job["ids"]), torch.tensor(job["mask"])
        with torch.no_grad():
            logits[job["name"]] = model(input_ids=ids, attention_mask=mask,
                                        position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits.contiguous()
        out = model.generate(torch.tensor([job["prompt"]]), max_new_tokens=job["max_new"], do_sample=False)
        result = {"class": type(model).__name__, "module": type(model).__module__, "generated": out[0].tolist(),
                  "eos": model.generation_config.eos_token_id, "pad": model.generation_config.pad_token_id,
                  "bos": model.generation_config.bos_token_id, "model_max_length": tok.model_max_length}
        if job.get("pipeline"):
            pipe = pipeline("text-generation", model=model, tokenizer=tok)
            text = tok.decode(job["prompt"])
            result["pipeline"] = pipe(text, max_new_tokens=job["max_new"], do_sample=False, return_full_text=False)[0]["generated_text"]
            result["pipeline_expected"] = tok.decode(job["expected"][len(job["prompt"]):], skip_special_tokens=True)
        return result

    for job in jobs:
        try:
            results[job["name"]] = run(job)
        except Exception as err:  # reported per case by the parent
            results[job["name"]] = {"error": f"{type(err).__name__}: {str(err)[:2000]}"}
    save_file(logits, sys.argv[2])
    with open(sys.argv[3], "w") as f:
        json.dump({"results": results, "slmlab_modules": sorted(m for m in sys.modules if m.startswith("slmlab"))}, f)
''')


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every case exported through `slmlab export`, then loaded in ONE fresh process without slmlab."""
    root = tmp_path_factory.mktemp("export")
    rows = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (10, 6)]
    ids, mask = left_pad(rows)
    jobs, ours = [], {}
    for name, family, overrides, _, native in CASES:
        run = make_run(root / f"run-{name}", family, overrides)
        out = root / f"hf-{name}"
        assert cli.main(["export", str(run), "--to", "hf", str(out)]) == 0
        model = get_family(family).model_class.from_pretrained(str(run / "checkpoints" / "step_000003")).eval()
        with torch.no_grad():
            ours[name] = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        eos = model.config.eos_token_id
        jobs.append({"name": name, "folder": str(out), "remote": not native, "ids": ids.tolist(), "mask": mask.tolist(),
                     "prompt": PROMPT, "max_new": MAX_NEW, "pipeline": name == "lumen", "expected": greedy(model, PROMPT, eos),
                     "eos": eos})
    env = {**os.environ, "HF_MODULES_CACHE": str(root / "hf-modules"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs), str(root / "logits.safetensors"),
                           str(root / "results.json")],
                          capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    child = json.loads((root / "results.json").read_text())
    return {"root": root, "jobs": {j["name"]: j for j in jobs}, "ours": ours, "mask": mask,
            "theirs": load_file(str(root / "logits.safetensors")), **child}


@pytest.mark.slow  # the shared fixture: 7 exports and one fresh process, ~30 s
def test_the_child_process_never_imported_slmlab(exported):
    assert exported["slmlab_modules"] == []


@pytest.mark.slow  # the shared fixture: 7 exports and one fresh process, ~30 s
@pytest.mark.parametrize("name, family, overrides, cls, native", CASES, ids=[c[0] for c in CASES])
def test_export_loads_without_slmlab_with_equal_logits(exported, name, family, overrides, cls, native):
    result = exported["results"][name]
    assert "error" not in result, result.get("error")
    assert result["class"] == cls
    assert result["module"].startswith("transformers.models." if native else "transformers_modules.")
    real = exported["mask"].bool()
    diff = (exported["theirs"][name][real] - exported["ours"][name][real]).abs().max().item()
    assert diff <= ATOL, f"{name}: max |logit difference| {diff:.3g} on the left-padded batch"


@pytest.mark.slow  # the shared fixture: 7 exports and one fresh process, ~30 s
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_greedy_generate_stops_at_eos(exported, name):
    job, result = exported["jobs"][name], exported["results"][name]
    assert "error" not in result, result.get("error")
    assert result["eos"] == job["eos"] is not None
    assert (result["bos"], result["pad"]) == (256, 258)
    assert result["generated"] == job["expected"]  # slmlab's greedy tokens, stopped at eos
    assert result["generated"][-1] == job["eos"] and len(result["generated"]) < len(PROMPT) + MAX_NEW
    assert result["model_max_length"] == CONTEXT


@pytest.mark.slow  # the shared fixture: 7 exports and one fresh process, ~30 s
def test_pipeline_stops_at_end_of_text(exported):
    result = exported["results"]["lumen"]  # the text of slmlab's greedy tokens up to eos
    assert result["pipeline"] == result["pipeline_expected"]


@pytest.mark.slow  # the shared fixture: 7 exports and one fresh process, ~30 s
@pytest.mark.parametrize("name", ["pgsm", "nanohammer", "neollm"])
def test_remote_code_folder_is_self_contained(exported, name):
    folder = Path(exported["jobs"][name]["folder"])
    config = json.loads((folder / "config.json").read_text())
    module, cls = config["auto_map"]["AutoModelForCausalLM"].split(".")
    assert (folder / f"{module}.py").is_file() and cls == config["architectures"][0]
    files = {path.stem: ast.parse(path.read_text()) for path in folder.glob("*.py")}
    for stem, tree in files.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "slmlab" for a in node.names), stem
            elif isinstance(node, ast.ImportFrom):
                assert (node.level, (node.module or "").split(".")[0]) != (0, "slmlab"), stem
                assert node.level == 0 or (node.level == 1 and node.module in files), (stem, node.module)


@pytest.mark.slow  # the shared fixture: 7 exports and one fresh process, ~30 s
def test_model_card_states_the_run(exported):
    card = (Path(exported["jobs"]["lumen"]["folder"]) / "README.md").read_text()
    assert "`LlamaForCausalLM`" in card and "family: `lumen`" in card
    assert f"trained context: {CONTEXT} tokens" in card and "2.1250 bits/byte" in card and "62 validation tokens" in card
    remote = (Path(exported["jobs"]["pgsm"]["folder"]) / "README.md").read_text()
    assert "trust_remote_code=True" in remote


# -- checkpoints that tell the truth -----------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(TINY))
def test_every_family_config_has_special_token_attributes(family):
    config = get_family(family).make_config(PRESET.get(family), **TINY[family])
    assert all(hasattr(config, n) for n in ("bos_token_id", "eos_token_id", "pad_token_id"))
    assert config.pad_token_id is None


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real 2-step `slmlab train` run on a tiny local corpus."""
    return train_tiny_run(tmp_path_factory.mktemp("trained"), CONTEXT, "To be, or not to be, that is the question.\n")


def test_trained_checkpoint_records_special_ids_and_context(trained):
    ckpt = trained / "checkpoints" / "step_000002"
    config = json.loads((ckpt / "config.json").read_text())
    generation = json.loads((ckpt / "generation_config.json").read_text())
    tok = json.loads((ckpt / "tokenizer_config.json").read_text())
    ids = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}  # slmlab's BPE puts its specials first
    assert {k: config[k] for k in ids} == ids and {k: generation[k] for k in ids} == ids
    assert tok["model_max_length"] == CONTEXT
    model = AutoModelForCausalLM.from_pretrained(str(ckpt))  # slmlab's own classes: generate() stops at eos
    assert model.config.eos_token_id == model.generation_config.eos_token_id == 1


def test_export_of_a_trained_run_carries_its_report(trained, tmp_path, capsys):
    out = tmp_path / "hf"
    assert cli.main(["export", str(trained), "--to", "hf", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    report = json.loads((trained / "report.json").read_text())
    card = (out / "README.md").read_text()
    assert f"{report['final_eval']['bits_per_byte']:.4f} bits/byte" in card
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 1
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "generation_config.json",
                                                "tokenizer.json", "tokenizer_config.json", "README.md"}


# -- bad input -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("small") / "run", "lumen", choose_eos=False)


def test_non_empty_output_is_refused_without_force(small_run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert cli.main(["export", str(small_run), "--to", "hf", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slmlab export: error: output folder") and "--force" in err
    assert (out / "keep.txt").read_text() == "mine"
    assert cli.main(["export", str(small_run), "--to", "hf", str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert not list(tmp_path.glob(".tmp-*"))


def test_dtype_sets_the_weights_on_disk(small_run, tmp_path):
    out = tmp_path / "bf16"
    assert cli.main(["export", str(small_run), "--to", "hf", str(out), "--dtype", "bf16"]) == 0
    weights = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_force_never_replaces_the_folder_being_exported(small_run, capsys):
    assert cli.main(["export", str(small_run / "checkpoints"), "--to", "hf", str(small_run), "--force"]) == 2
    assert "holds the model being exported" in capsys.readouterr().err
    assert (small_run / "checkpoints" / "step_000003" / "model.safetensors").is_file()


@pytest.mark.parametrize("argv, message", [
    (["--to", "onnx"], "unknown export target 'onnx'; targets: hf"),
    (["--to", "hf", "--dtype", "q8_0"], "--dtype 'q8_0' is not available for --to hf"),
])
def test_bad_target_or_dtype_is_refused(small_run, tmp_path, argv, message, capsys):
    assert cli.main(["export", str(small_run), *argv, str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slmlab export: error:") and message in err and "gguf" in err
    assert not (tmp_path / "out").exists()


def test_missing_source_and_missing_tokenizer_are_clear(small_run, tmp_path, capsys):
    assert cli.main(["export", str(tmp_path / "nope"), "--to", "hf", str(tmp_path / "out")]) == 2
    assert "no run or checkpoint" in capsys.readouterr().err
    bare = tmp_path / "bare"
    tiny_model("lumen").save_pretrained(str(bare))
    assert cli.main(["export", str(bare), "--to", "hf", str(tmp_path / "out")]) == 2
    assert "has no tokenizer.json" in capsys.readouterr().err


# -- families own their exports ------------------------------------------------------------------------

def test_every_family_declares_its_export_and_the_exporters_name_none():
    """Each family's convert.py declares how it leaves (registered with the family); the export
    package looks it up and holds no family name as a string and no ``family ==`` branch."""
    import slmlab.export
    from slmlab.models.registry import families, get_export_info

    for name, fam in families().items():
        info = get_export_info(name)
        assert fam.export is info and info.display_name, name
        assert (info.hf_twin is None) == bool(info.hf_reason), name  # remote code says why
    names = set(families())
    for path in Path(slmlab.export.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not strings & names, (path.name, strings & names)
        compares = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare) and "family" in ast.unparse(n.left)]
        assert not compares, (path.name, compares)
