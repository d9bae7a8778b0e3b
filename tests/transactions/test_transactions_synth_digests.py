"""The generator's output is held byte for byte: the CSV SHA-256s of every bank file of the ``tiny``
preset at two seeds (seed 1 holds all four fraud patterns; seed 0 is the preset's own), the demo's
spree builders (the pattern functions it imports) and :func:`expected_fraud_counts`.

The digests were computed before ``data/synth.py`` was rewritten for readability; any change to what
the generator draws, or in which order, changes them."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.transactions.data.bank import export  # noqa: E402
from slmlab.transactions.data.synth import (  # noqa: E402
    CT_MCCS,
    MCC_INDEX,
    PATTERNS,
    SynthConfig,
    account_takeover_block,
    blocks_to_frame,
    card_testing_attempts,
    expected_fraud_counts,
    generate,
    lost_stolen_block,
    txn_block,
    world_of,
)

TINY_SHA = {
    1: {"transactions": "152bca39eb62ee6bc6dd081826e56e5ac3ae17288c8fe3df75edf88fc5b78cc2",
        "customers": "03696404f5176152d5b26733100fd52e4fe30bcda269491172f22bbabb5c48fb",
        "merchants": "018cccb070b5a10d164e9096377b4fc10edca0dfba280d780c732d8cdda2e3cf",
        "fraud_cases": "954b474aaea31efc84cd84331866d438b95052530eda967810982b49ecadd56a"},
    0: {"transactions": "626be8cdb50a8de5c16729f64adfd93d1af9acfb9d669c9dadc205ad822afe44",
        "customers": "94a9b1d2440ef437a1885a685e02a351a10f32f8aa260a608aa14583f752c1a1",
        "merchants": "a087d1ebbecefb76f71422e0c3b4c7c46b601eb92966cb6dc4540af92874a3d0",
        "fraud_cases": "f0c6d2de9366c712ad06a8903a3ec9a0acb610955262d0276f32c726ae6f6070"},
}
# expected_fraud_counts(tiny, seed 1, days 30-50), as sorted JSON
COUNTS_SHA = "74cd0e75e438037fffd887b2c15c544117d69ce851a4a5dc5ea984a1c67c5fe0"
# the demo's three sprees (blocks_to_frame of each pattern function) on the tiny world, as CSV
SPREES_SHA = "e289c7d5b5ca5546e80ce6b857fd032926f4cf8fe74879a57cedc48c84830b45"


@pytest.mark.parametrize("seed", sorted(TINY_SHA))
def test_the_tiny_bank_is_byte_identical(seed, tmp_path):
    data = generate(SynthConfig.from_preset("tiny", seed=seed))
    manifest = export(data, tmp_path, "csv")
    assert {name.split(".")[0]: sha for name, sha in manifest["sha256"].items()} == TINY_SHA[seed]
    if seed == 1:  # the held bank exercises every pattern
        assert set(data.transactions.loc[data.transactions.is_fraud == 1, "fraud_type"]) == set(PATTERNS)


def test_expected_fraud_counts_are_unchanged():
    counts = expected_fraud_counts(SynthConfig.from_preset("tiny", seed=1), 30, 50)
    assert hashlib.sha256(json.dumps(counts, sort_keys=True).encode()).hexdigest() == COUNTS_SHA


def test_the_spree_builders_are_unchanged():
    cfg = SynthConfig.from_preset("tiny", seed=1)
    world = world_of(cfg)
    rng = np.random.default_rng(7)
    pool = np.concatenate([world.online.get(MCC_INDEX[m], np.zeros(0, int)) for m in CT_MCCS])
    ev = card_testing_attempts(rng, pool[:2], pool[2:5], 3600, 29_000, cfg.difficulty, cfg.behaviour)
    card_testing = txn_block(len(ev["t"]), t=ev["t"], merchant=ev["merchant"], amount=ev["amount"],
                             txn_type=ev["txn_type"], entry=4, auth=ev["auth"], device=ev["device"],
                             response=ev["response"], tz=-300)
    mcc_w = np.full(len(MCC_INDEX), 1.0 / len(MCC_INDEX))
    takeover = account_takeover_block(rng, world, mcc_w, np.array([12.0, 40.0, 0.0, 75.5]), cfg.difficulty, -300,
                                      10_900, (7200, 7201), cfg.behaviour)
    stolen = lost_stolen_block(rng, world, 3, cfg.difficulty, -300, (9000, 9001), cfg.behaviour)
    frames = [blocks_to_frame([block], world, cfg, 5, 90_000, kind, case=99)
              for block, kind in ((card_testing, "card_testing"), (takeover, "account_takeover"),
                                  (stolen, "lost_stolen"))]
    text = "".join(frame.to_csv(index=False, lineterminator="\n") for frame in frames)
    assert hashlib.sha256(text.encode()).hexdigest() == SPREES_SHA
