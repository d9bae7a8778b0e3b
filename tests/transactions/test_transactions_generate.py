"""Next-transaction generation from the per-feature LM heads."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.transactions.data.schema import MASK, PAD, UNK  # noqa: E402
from slmlab.transactions.generate import (  # noqa: E402
    NextTransactions,
    encoder_of,
    generate_next_transaction,
    next_transaction_topk,
)
from slmlab.transactions.heads.fraud import TransactionFraudModel  # noqa: E402
from slmlab.transactions.model import TransactionEncoder, TxnEncoderConfig  # noqa: E402


@pytest.fixture(scope="module")
def model(bank):
    torch.manual_seed(1)
    return TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted)).eval()


@pytest.fixture(scope="module")
def history(bank):
    """The longest customer's newest transactions: ``[n, F]`` with ``n`` > the window."""
    enc = max(bank.encoded().values(), key=len)
    return torch.from_numpy(enc[-40:].astype("int64"))


def reference_greedy(model, history: torch.Tensor, fixed: dict[int, int] | None = None):
    """By hand: the last T-1 rows + a MASK row, then per field the argmax of head f at position
    (T-1)*F + f - 1 over ids other than PAD/MASK/UNK and the ids the fit left unassigned; returns
    (ids, per-field probabilities)."""
    T, F = model.config.max_transactions, history.shape[-1]
    window = torch.cat([history[-(T - 1):], torch.full((1, F), MASK)])[None].clone()
    chosen, probs = [], []
    for f in range(F):
        logits = model.per_feature_logits(window)[f][0, (T - 1) * F + f - 1].clone()
        logits[[PAD, MASK, UNK]] = float("-inf")
        logits[model.config.fitted_schema.num_assigned(f):] = float("-inf")
        p = torch.softmax(logits, -1)
        probs.append(p)
        tok = (fixed or {}).get(f, int(p.argmax()))
        window[0, -1, f] = tok
        chosen.append(tok)
    return torch.tensor(chosen), probs


def test_temperature_zero_is_deterministic_and_the_head_by_head_argmax(model, history):
    ref, ref_probs = reference_greedy(model, history)
    a = generate_next_transaction(model, history, n_samples=3, temperature=0)
    b = generate_next_transaction(model, history[None], n_samples=3, temperature=0)
    assert isinstance(a, NextTransactions) and a.ids.shape == (3, 15)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.ids, ref.expand(3, -1))
    top = next_transaction_topk(model, history, k=5)
    assert [t[0][0] for t in top] == ref.tolist()
    for f, t in enumerate(top):
        want = ref_probs[f].topk(5)
        assert [i for i, _ in t] == want.indices.tolist()
        torch.testing.assert_close(torch.tensor([p for _, p in t]), want.values, rtol=0, atol=1e-5)


def test_topk_sorted_sums_at_most_one_and_never_specials(model, history):
    top = next_transaction_topk(model, history, k=7)
    assert len(top) == 15
    fitted = model.config.fitted_schema
    for f, t in enumerate(top):
        probs = [p for _, p in t]
        assert len(t) == min(7, fitted.num_assigned(f) - 3) and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
        assert all(0 <= p <= 1 for p in probs) and not {i for i, _ in t} & {PAD, MASK, UNK}
    g = torch.Generator().manual_seed(0)
    out = generate_next_transaction(model, history, n_samples=24, temperature=2.0, generator=g)
    assert not torch.isin(out.ids, torch.tensor([PAD, MASK, UNK])).any()
    limits = torch.tensor([fitted.num_assigned(f) for f in range(15)])
    assert bool((out.ids < limits).all())
    assert not any("unused id" in v for row in out.rows for v in row.values())


def test_num_assigned_is_where_decoding_stops_naming_values(model):
    fitted = model.config.fitted_schema
    short = 0
    for f, v in enumerate(model.embedding.vocab_sizes):
        n = fitted.num_assigned(f)
        assert 4 < n <= v and "unused id" not in fitted.decode(f, n - 1)
        if n < v:
            short += 1
            assert "unused id" in fitted.decode(f, n)
    assert short >= 1  # the tiny bank leaves some vocabulary unfilled (mcc's top-k, device ids)


def test_fixed_fields_are_forced_and_condition_the_later_fields(model, history):
    names = model.feature_names
    f_mcc = names.index("mcc")
    free = next_transaction_topk(model, history, k=3)
    forced_id = free[f_mcc][-1][0]  # the third choice, not the argmax
    fixed = next_transaction_topk(model, history, fixed={"mcc": forced_id}, k=3)
    assert fixed[:f_mcc + 1] == free[:f_mcc + 1]  # earlier fields and mcc's own top-k unchanged
    assert any(fixed[f] != free[f] for f in range(f_mcc + 1, 15))  # later distributions move
    ref, _ = reference_greedy(model, history, {f_mcc: forced_id})
    out = generate_next_transaction(model, history, n_samples=2, temperature=0, fixed={"mcc": forced_id})
    assert torch.equal(out.ids[0], ref) and int(out.ids[1, f_mcc]) == forced_id
    g = torch.Generator().manual_seed(0)
    sampled = generate_next_transaction(model, history, 16, 1.0, top_k=3, fixed={"mcc": forced_id}, generator=g)
    assert bool((sampled.ids[:, f_mcc] == forced_id).all())


def test_sampling_is_reproducible_and_top_k_restricts(model, history):
    run = [generate_next_transaction(model, history, 8, 1.0, 2, generator=torch.Generator().manual_seed(5)).ids
           for _ in range(2)]
    assert torch.equal(*run)
    top2 = next_transaction_topk(model, history[-(model.config.max_transactions - 1):], k=2)
    assert int(run[0][0, 0]) in {i for i, _ in top2[0]}  # field 0 depends on the history only


def test_decode_gives_readable_strings(model, history):
    out = generate_next_transaction(model, history, n_samples=2, temperature=0)
    assert len(out.rows) == 2 and list(out.rows[0]) == model.feature_names
    assert all(isinstance(v, str) and v.startswith(k) for k, v in out.rows[0].items())


def test_history_placement_left_padding_and_window_trimming(model, history):
    T = model.config.max_transactions
    short = history[-5:]
    padded = torch.cat([torch.zeros(3, 15, dtype=torch.long), short])
    assert next_transaction_topk(model, short) == next_transaction_topk(model, padded)
    assert next_transaction_topk(model, history) == next_transaction_topk(model, history[-(T - 1):])


def test_a_fine_tuned_model_is_accepted_and_bad_input_refused(model, history):
    fraud = TransactionFraudModel.from_encoder(model).eval()
    assert encoder_of(fraud) is fraud.encoder
    assert torch.equal(generate_next_transaction(fraud, history, temperature=0).ids,
                       generate_next_transaction(model, history, temperature=0).ids)
    bare = TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny")).eval()
    with pytest.raises(ValueError, match="schema.fitted.json"):
        generate_next_transaction(bare, history)
    with pytest.raises(ValueError, match="not a feature"):
        next_transaction_topk(model, history, fixed={"nope": 4})
    with pytest.raises(ValueError, match="PAD/MASK"):
        next_transaction_topk(model, history, fixed={"mcc": MASK})
    with pytest.raises(ValueError, match="no transactions"):
        next_transaction_topk(model, torch.zeros(4, 15, dtype=torch.long))
    with pytest.raises(ValueError, match="history must be"):
        next_transaction_topk(model, history[:, :7])
    with pytest.raises(ValueError, match="not a transaction encoder"):
        encoder_of(torch.nn.Linear(2, 2))
