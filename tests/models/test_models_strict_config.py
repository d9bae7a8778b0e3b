"""Every family's config rejects an unknown keyword where a person types it (Python, ``make_config``;
the CLI and YAML in tests/commands), with the CLI's "did you mean" message
(``slmlab.models.registry.check_config_keys``), while a saved config loads with every key it carries
(transformers' tests and clients add attributes, and ``save_pretrained`` writes them)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

import slmlab

FAMILIES = sorted(slmlab.families())


def typo_error(name: str, typo: str, meant: str) -> str:
    return rf"unknown {name} config key\(s\): '{typo}' \(did you mean '{meant}'"


def test_the_readme_example_typo_is_refused():
    with pytest.raises(ValueError, match=typo_error("lumen", "hiden_dim", "hidden_dim")):
        AutoConfig.for_model("sage_lumen", hiden_dim=3)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_typo_is_refused_where_a_person_types_it(name):
    cls = slmlab.get_family(name).config_class
    match = typo_error(name, "vocab_sise", "vocab_size")
    with pytest.raises(ValueError, match=match):
        cls(vocab_sise=3)
    with pytest.raises(ValueError, match=match):
        AutoConfig.for_model(cls.model_type, vocab_sise=3)
    with pytest.raises(ValueError, match=match):
        slmlab.get_family(name).make_config(vocab_sise=3)
    with pytest.raises(ValueError, match=r"unknown .* 'zzz_not_a_field'; fix the key"):  # no close match: no hint
        cls(zzz_not_a_field=1)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_saved_config_keeps_every_key_it_carries(name, tmp_path):
    """What clients do (transformers' own tests set ``batch_norm_eps``; peft/trl add tags): an extra
    attribute saves, loads again with its value, and is saved again; never refused on load."""
    cls = slmlab.get_family(name).config_class
    cfg = cls()
    cfg.batch_norm_eps, cfg.my_tag, cfg.vocab_sise = 1.0, {"a": [1, 2]}, 3
    cfg.save_pretrained(tmp_path / "one")
    back = AutoConfig.from_pretrained(tmp_path / "one")
    assert type(back) is cls
    assert (back.batch_norm_eps, back.my_tag, back.vocab_sise) == (1.0, {"a": [1, 2]}, 3)
    assert back.vocab_size == cfg.vocab_size
    back.save_pretrained(tmp_path / "two")
    saved = json.loads((tmp_path / "two" / "config.json").read_text())
    assert (saved["batch_norm_eps"], saved["my_tag"], saved["vocab_sise"]) == (1.0, {"a": [1, 2]}, 3)
    assert cls.from_dict({**cls().to_dict(), "layer_norm_eps": 0.5}).layer_norm_eps == 0.5
    # loading leaves the class strict: a typo typed afterwards is still refused
    with pytest.raises(ValueError, match=typo_error(name, "vocab_sise", "vocab_size")):
        cls(vocab_sise=3)


@pytest.mark.parametrize("name", FAMILIES)
def test_what_transformers_writes_and_passes_still_loads(name, tmp_path):
    cls = slmlab.get_family(name).config_class
    cfg = cls()
    saved = cfg.to_dict()
    assert cls.from_dict(saved).to_dict() == saved
    assert cls(**saved).to_dict() == saved
    cfg.save_pretrained(tmp_path)
    back = AutoConfig.from_pretrained(tmp_path, attn_implementation="eager", dtype="float32")
    assert type(back) is cls
    assert {k: v for k, v in back.to_dict().items() if k not in ("_name_or_path", "dtype")} == {
        k: v for k, v in saved.items() if k not in ("_name_or_path", "dtype")}
    # bookkeeping transformers (or an older version, or the seeds' classes) puts into a config
    cls(architectures=["X"], transformers_version="4.57.1", torch_dtype="float32", dtype="float32", name_or_path="x",
        _commit_hash="abc", attn_implementation="sdpa", output_attentions=False, num_labels=2, max_length=20,
        auto_map={"AutoConfig": "configuration_x.XConfig"}, use_cache=False, is_decoder=True)
    for alias, field in cls.attribute_map.items():  # the documented aliases
        assert getattr(cls(**{alias: getattr(cfg, field)}), field) == getattr(cfg, field)


@pytest.mark.parametrize("name", ["lumen", "lfm2", "pgsm"])  # NanoHammer and NeoLLM use the transformers names
def test_transformers_names_build_the_same_config_as_the_family_names(name):
    """``hidden_size=...`` (the transformers alias) must reach the family's checks and derived values
    (Lumen's ``head_dim``), not only the stored field: a config built with the aliases equals one built
    with the family's own names, at a size where the aliased fields differ from their defaults."""
    from slmlab.models.registry import get_family

    family = get_family(name)
    cls = family.config_class
    own = family.fit_budget(60_000)
    by_alias = {field: alias for alias, field in cls.attribute_map.items()}
    renamed = {by_alias.get(k, k): v for k, v in own.items()}
    assert set(renamed) != set(own), "the budget fit must set an aliased field"
    a, b = cls(**own).to_dict(), cls(**renamed).to_dict()
    a.pop("transformers_version", None), b.pop("transformers_version", None)
    assert a == b


@pytest.mark.parametrize("name, size", [("lumen", "vocab_size"), ("lfm2", "vocab_size"), ("pgsm", "vocab_size"),
                                        ("nanohammer", "vocab_size"), ("neollm", "vocab_size")])
@pytest.mark.parametrize("value", [2.5, 256.0, True, 0, -3])
def test_every_family_refuses_a_size_that_is_not_a_positive_integer(name, size, value):
    """One rule for sizes in every family: a float (2.5, or 256.0), a bool or a non-positive number is
    refused, naming the field (Lumen once took int(2.5) = 2, PGSM took True as 1)."""
    from slmlab.models.registry import get_family

    with pytest.raises(ValueError, match=rf"{size}`? must be a positive integer"):
        get_family(name).config_class(**{size: value})
