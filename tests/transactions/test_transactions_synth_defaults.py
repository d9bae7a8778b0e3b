"""The generator's behaviour settings (``BehaviourConfig``) leave the default bank byte-identical.

The expected SHA-256s were computed with the generator as it was before its probabilities moved into
``BehaviourConfig`` (the same settings, the same CSV export)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.transactions.data.bank import export  # noqa: E402
from slmlab.transactions.data.synth import DEFAULT_BEHAVIOUR, BehaviourConfig, SynthConfig, generate  # noqa: E402
from test_transactions_pipeline import SMALL  # noqa: E402

# CSV SHA-256s of the tiny preset with SMALL (the tests' bank), before the refactor
SMALL_SHA = {"transactions": "0ef0f18bd9667df86081b1d955348d6187a45d4f09e6acd8448e858c5690378c",
             "customers": "a2eb46e291c55c7440b2c9909fa9a7b4557f290a27f0f1a6b623b2ec7ea71e32",
             "fraud_cases": "ebbb78103c36f7955976da30c83be12db52748e1cc04e4210d7223367c305cbc"}
# ... and of a smaller bank at difficulty 0 (the patterns' easy ranges; all four patterns present)
EASY = dict(n_customers=60, n_days=45, n_physical_merchants=300, n_online_merchants=80, seed=7, target_fraud_rate=0.01,
            difficulty=0.0)
EASY_SHA = {"transactions": "1ca3ddf2c12110c431ffb806c015b0fe7d94127a7936fa6378386fec458f9856",
            "customers": "367d16eb5e147bb082e295c653c9c732fc689f7229f853c12050f05761376099",
            "fraud_cases": "4b1dd55301b4f79c0fde0703b6434a097d28a42aafa26094f0b64588a723e8a0"}


def csv_sha(data, folder) -> dict[str, str]:
    export(data, folder, "csv")
    return {name: hashlib.sha256((folder / f"{name}.csv").read_bytes()).hexdigest() for name in SMALL_SHA}


def test_default_behaviour_gives_the_same_bank_as_before(bank_data, tmp_path):
    assert SynthConfig.from_preset("tiny", **SMALL).behaviour == BehaviourConfig() == DEFAULT_BEHAVIOUR
    assert csv_sha(bank_data, tmp_path / "small") == SMALL_SHA
    easy = generate(SynthConfig.from_preset("tiny", **EASY))
    assert set(easy.transactions.fraud_type.dropna()) - {"None"} == {"card_testing", "account_takeover",
                                                                     "counterfeit_after_compromise", "lost_stolen"}
    assert csv_sha(easy, tmp_path / "easy") == EASY_SHA
    # the manifest of a default bank names no behaviour (it is the default), so it is unchanged too
    manifest = json.loads((tmp_path / "small" / "manifest.json").read_text())
    assert manifest["config"] is None
    export(bank_data, tmp_path / "cfg", "csv", cfg=SynthConfig.from_preset("tiny", **SMALL))
    assert "behaviour" not in json.loads((tmp_path / "cfg" / "manifest.json").read_text())["config"]


def test_behaviour_is_a_documented_validated_setting_of_the_generator(tmp_path):
    fields = dataclasses.fields(BehaviourConfig)
    assert len(fields) > 50 and all(isinstance(f.default, (int, float, tuple)) for f in fields)
    changed = SynthConfig.from_preset("tiny", **{**EASY, "difficulty": 1.0, "behaviour": {"ct_decline_share": 1.0}})
    assert changed.behaviour.ct_decline_share == 1.0 and changed.behaviour.ct_attempts == (3, 21)
    tx = generate(changed).transactions
    ct = tx[tx.fraud_type == "card_testing"]
    attempts = ct[ct.amount < 100]  # cash-outs follow only an approved attempt: none here
    assert len(attempts) and (attempts.response_code != "approved").all() and len(ct) == len(attempts)
    assert SynthConfig(**{**changed.to_dict()}).behaviour == changed.behaviour  # a manifest's config round-trips
    for bad, message in [({"ct_decline_share": 1.5}, "probability"), ({"entry_mix": (0.5, 0.5, 0.5, 0.5)}, "summing"),
                         ({"ato_hours": (48.0, 1.0)}, "range")]:
        with pytest.raises(ValueError, match=message):
            SynthConfig.from_preset("tiny", behaviour=bad)
    with pytest.raises(TypeError):
        SynthConfig.from_preset("tiny", behaviour={"no_such_field": 1})
