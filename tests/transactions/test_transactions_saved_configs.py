"""Every config.json the transactions configs wrote before they were typed (tests/transactions/saved_txn_configs.py)
still loads, through ``AutoConfig``, the class's ``from_pretrained`` and the transactions loader, with the same
attribute values, saves again to the same JSON, and builds a model with the same outputs; the signatures keep
the old keywords, and no config class writes its own ``__init__``."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, PretrainedConfig

import slmlab.transactions.heads as heads
import slmlab.transactions.model as txn_model
from saved_txn_configs import CASES, OUTPUTS, SCHEMAS, SIGNATURES
from slmlab.transactions.heads.spec import HEADS
from slmlab.transactions.model import TransactionEncoder, TxnEncoderConfig
from slmlab.transactions.pipeline import load_model

CLASSES = {"encoder": TxnEncoderConfig, **{spec.config_class.model_type.removeprefix("slmlab_txn_"): spec.config_class
                                           for spec in HEADS.values()}}
MODELS = {"encoder": TransactionEncoder, **{spec.config_class.model_type.removeprefix("slmlab_txn_"): spec.model_class
                                            for spec in HEADS.values()}}
STAMPED = ("transformers_version",)  # what transformers itself writes into every config.json


def plain(value):
    """``value`` as JSON gives it back (tuples as lists, int dict keys as strings; others by repr)."""
    return json.loads(json.dumps(value, default=repr))


def saved_json(case: dict) -> dict:
    return {**case["json"], "schema": SCHEMAS[case["schema"]]}


def unstamped(data: dict) -> dict:
    return {k: v for k, v in data.items() if k not in STAMPED}


def write_config(case: dict, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(saved_json(case)))
    return folder


def check_values(config: PretrainedConfig, case: dict) -> None:
    """Every saved value, the other attributes the old class gave, the same attribute names, and
    transformers' bookkeeping as a bare config's."""
    data = unstamped(saved_json(case))
    assert {k: plain(getattr(config, k)) for k in data} == data
    assert {k: plain(getattr(config, k)) for k in case["attrs"]} == case["attrs"]
    assert sorted(vars(config)) == case["attr_names"]
    bare = vars(PretrainedConfig())
    shown = {*data, *case["attrs"], *STAMPED, "_name_or_path"}
    assert {k: plain(v) for k, v in vars(config).items() if k in bare and k not in shown} == {
        k: plain(v) for k, v in bare.items() if k in vars(config) and k not in shown}


def resaved(config: PretrainedConfig, folder: Path) -> dict:
    config.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_saved_config_loads_with_the_same_values_and_saves_the_same_json(name, tmp_path):
    case = CASES[name]
    cls = CLASSES[case["kind"]]
    folder = write_config(case, tmp_path / "saved")
    for config in (AutoConfig.from_pretrained(folder), cls.from_pretrained(folder)):
        assert type(config) is cls
        check_values(config, case)
        assert unstamped(resaved(config, tmp_path / "again")) == unstamped(saved_json(case))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_same_keywords_build_the_same_config(name, tmp_path):
    case = CASES[name]
    cls = CLASSES[case["kind"]]
    config = cls() if name.endswith("/default") else cls.from_preset("lfm2_tiny", **case["kwargs"])
    assert unstamped(resaved(config, tmp_path)) == unstamped(saved_json(case))


@pytest.mark.parametrize("kind", sorted(SIGNATURES))
def test_the_signature_keeps_every_old_keyword_and_default_in_order(kind):
    params = [[p.name, p.default] for p in inspect.signature(CLASSES[kind].__init__).parameters.values()
              if p.name not in ("self", "kwargs")]
    assert [p for p in params if p[0] in {name for name, _ in SIGNATURES[kind]}] == SIGNATURES[kind]


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_a_model_built_from_a_saved_config_gives_the_same_output_and_loads_back(name, tmp_path):
    case = CASES[name]
    config = AutoConfig.from_pretrained(write_config(case, tmp_path / "config"))
    model_class = MODELS[case["kind"]]
    torch.manual_seed(0)
    model = model_class(config).eval()
    g = torch.Generator().manual_seed(0)
    encoder = model if case["kind"] == "encoder" else model.encoder
    ids = torch.cat([torch.randint(4, v, (2, 6, 1), generator=g) for v in encoder.embedding.vocab_sizes], -1)
    extra = {}
    if getattr(config, "tabular_features", None):
        extra["tabular"] = torch.linspace(-1, 1, 2 * 6 * len(config.tabular_features)).reshape(2, 6, -1)

    def output(m) -> torch.Tensor:
        with torch.no_grad():
            out = m(ids, **extra)
        value = out[{"encoder": "last_hidden_state", "customer": "embeddings"}.get(case["kind"], "logits")]
        return torch.cat([v.reshape(-1) for v in value.values()]) if isinstance(value, dict) else value

    got, expected = output(model), OUTPUTS[name]
    assert list(got.shape) == expected["shape"]
    assert float(got.sum()) == pytest.approx(expected["sum"], rel=1e-4, abs=1e-4)
    assert float(got.abs().sum()) == pytest.approx(expected["abs_sum"], rel=1e-5)
    assert torch.allclose(got.reshape(-1)[:12], torch.tensor(expected["head"]), atol=1e-5)
    model.save_pretrained(tmp_path / "model")
    back = load_model(tmp_path / "model", model_class).eval()
    assert type(back.config) is type(config)
    assert {k: plain(getattr(back.config, k)) for k in case["json"] if k not in STAMPED} == unstamped(case["json"])
    assert torch.allclose(output(back), got, rtol=1e-5, atol=1e-7)


def test_no_transactions_config_class_writes_its_own_init():
    """Typed configs (fields with defaults, checks in ``__post_init__``): an ``__init__`` in a config
    class would bring back the untyped idiom (docs/contributing.md)."""
    files = [Path(txn_model.__file__), *sorted(Path(heads.__file__).parent.glob("*.py"))]
    found = [f"{path.name}: {node.name}" for path in files for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ClassDef) and node.name.endswith("Config")
             and any(isinstance(item, ast.FunctionDef) and item.name == "__init__" for item in node.body)]
    assert found == []
