"""Every config.json a family config wrote before the configs were typed (tests/models/saved_family_configs.py)
still loads, through ``AutoConfig``, the class's ``from_pretrained`` and slmlab's own loader, with the same
attribute values, saves again to the same JSON, and builds a model with the same logits; the signatures and
the accepted keys are the ones the classes had. Every family config is typed: no ``def __init__`` in any
``models/*/configuration_*.py``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

import slmlab
from saved_family_configs import CASES, KEYS, OUTPUTS, SIGNATURES
from slmlab.models.registry import config_keys
from slmlab.train.saved import load_saved_model, open_checkpoint

# What transformers itself writes into every config.json (the version it was saved with).
STAMPED = ("transformers_version",)


def plain(value):
    """``value`` as JSON gives it back (tuples as lists, int dict keys as strings; others by repr)."""
    return json.loads(json.dumps(value, default=repr))


def saved(config: PretrainedConfig, folder) -> dict:
    config.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def unstamped(data: dict) -> dict:
    return {k: v for k, v in data.items() if k not in STAMPED}


def write_config(case: dict, folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(case["json"]))
    return folder


def check_values(config: PretrainedConfig, case: dict) -> None:
    """The attributes of a config loaded from ``case``'s JSON: every saved value, every alias and derived
    value the old class gave, the same attribute names, and transformers' bookkeeping as a bare config's."""
    assert {k: plain(getattr(config, k)) for k in case["json"] if k not in STAMPED} == unstamped(case["json"])
    assert {k: plain(getattr(config, k)) for k in case["attrs"]} == case["attrs"]
    assert sorted(vars(config)) == case["attr_names"]
    bare = vars(PretrainedConfig())
    shown = {*case["json"], *case["attrs"], "_name_or_path"}
    assert {k: plain(v) for k, v in vars(config).items() if k in bare and k not in shown} == {
        k: plain(v) for k, v in bare.items() if k in vars(config) and k not in shown}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_saved_config_loads_with_the_same_values_and_saves_the_same_json(name, tmp_path):
    case = CASES[name]
    cls = slmlab.get_family(case["family"]).config_class
    folder = write_config(case, tmp_path / "saved")
    for config in (AutoConfig.from_pretrained(folder), cls.from_pretrained(folder)):
        assert type(config) is cls
        check_values(config, case)
        assert unstamped(saved(config, tmp_path / "again")) == unstamped(case["json"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_same_keywords_build_the_same_config(name, tmp_path):
    case = CASES[name]
    family = slmlab.get_family(case["family"])
    preset = name.split("/", 1)[1]
    config = family.make_config(preset) if preset in family.presets else family.make_config(**case["kwargs"])
    assert unstamped(saved(config, tmp_path)) == unstamped(case["json"])


@pytest.mark.parametrize("family", sorted(SIGNATURES))
def test_the_signature_and_the_accepted_keys_are_the_old_ones(family):
    cls = slmlab.get_family(family).config_class
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name not in ("self", "kwargs")]
    assert [[p.name, p.default] for p in params] == SIGNATURES[family]
    common = config_keys(PretrainedConfig)
    assert sorted(config_keys(cls) - common) == sorted(set(KEYS[family]) - common)


def digest_matches(logits: torch.Tensor, expected: dict) -> None:
    assert list(logits.shape) == expected["shape"]
    assert float(logits.sum()) == pytest.approx(expected["sum"], rel=1e-4, abs=1e-3)
    assert float(logits.abs().sum()) == pytest.approx(expected["abs_sum"], rel=1e-5)
    assert torch.allclose(logits.reshape(-1)[:12], torch.tensor(expected["head"]), atol=1e-5)


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_a_model_built_from_a_saved_config_gives_the_same_logits_and_loads_back(name, tmp_path):
    """Built with seed 0 from the saved config: the logits the old class gave. Saved and read back by
    slmlab's loader (the one ``train --model``, ``finetune`` and the inference commands use): the same
    family, config and logits."""
    case = CASES[name]
    config = AutoConfig.from_pretrained(write_config(case, tmp_path / "config"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = (torch.arange(10)[None] * 7 + 3) % config.vocab_size
    with torch.no_grad():
        logits = model(ids).logits
    digest_matches(logits, OUTPUTS[name])
    model.save_pretrained(tmp_path / "model")
    assert open_checkpoint(tmp_path / "model").family is slmlab.get_family(case["family"])
    loaded = load_saved_model(tmp_path / "model").eval()
    assert {k: plain(getattr(loaded.config, k)) for k in case["json"] if k not in STAMPED} == unstamped(case["json"])
    assert {k: plain(getattr(loaded.config, k)) for k in case["attrs"]} == case["attrs"]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, logits)


def test_no_family_config_writes_its_own_init():
    """The one config idiom (docs/contributing.md): annotated fields with defaults, derived values and
    checks in ``__post_init__``; a ``def __init__`` in a configuration module brings the untyped one back."""
    files = sorted(Path(slmlab.models.__file__).parent.glob("*/configuration_*.py"))
    assert len(files) == len(slmlab.families())
    found = [f"{path.parent.name}/{path.name}: {node.name}.__init__" for path in files
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
             for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"]
    assert found == []


@pytest.mark.parametrize("family", sorted(SIGNATURES))
def test_every_keyword_is_a_typed_field_or_a_declared_init_only_one(family):
    cls = slmlab.get_family(family).config_class
    own = {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(PretrainedConfig)}
    keywords = {name for name, _ in SIGNATURES[family]}
    init_only = vars(inspect.getmodule(cls)).get("INIT_ONLY_KEYWORDS", {})
    assert own | set(init_only) == keywords and not own & set(init_only)
    assert all(isinstance(f.type, str) and f.type for f in dataclasses.fields(cls))
    with pytest.raises(ValueError, match="accepts only keyword arguments"):
        cls(1)
