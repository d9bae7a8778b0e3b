"""The steppable decoder: its token stream is generate()'s, stopping is a value, rows join and leave."""

from __future__ import annotations

import pytest
import torch

from slmlab.generation import MODEL_FORWARD, PLAN, Decoder, SamplingConfig, generate
from slmlab.layers.cache import CannotBatch
from slmlab.models.lumen import LumenConfig, LumenForCausalLM


def tiny_model(vocab=64):
    torch.manual_seed(0)
    return LumenForCausalLM(LumenConfig(vocab_size=vocab, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=1,
                                        intermediate_dim=32)).eval()


@pytest.mark.parametrize("use_plan", [True, False], ids=["plan", "forward"])
def test_stepping_gives_generates_tokens_for_the_same_seed(use_plan):
    model = tiny_model()
    ids = torch.randint(0, 64, (2, 5))
    cfg = SamplingConfig(temperature=0.9, top_k=20, top_p=0.9)
    want = generate(model, ids, 12, cfg, generator=torch.Generator().manual_seed(7), use_plan=use_plan)
    decoder = Decoder(model, cfg, generator=torch.Generator().manual_seed(7), use_plan=use_plan)
    decoder.prefill(ids, max_new_tokens=12)
    got = []
    while not decoder.done:
        got.append(decoder.step())
    assert decoder.path == (PLAN if use_plan else MODEL_FORWARD) == want.decode_path
    assert torch.equal(torch.stack(got, 1), want[:, 5:]) and decoder.steps == 12
    with pytest.raises(RuntimeError, match="done"):
        decoder.step()


def test_stop_tokens_end_the_run_and_a_caller_may_stop_earlier_at_no_cost():
    model = tiny_model()
    ids = torch.randint(0, 64, (1, 5))
    free = generate(model, ids, 10)[0, 5:].tolist()
    stop = free[3]
    decoder = Decoder(model, stop_tokens=[stop]).prefill(ids, max_new_tokens=10)
    assert [int(t) for t in decoder] == free[: free.index(stop) + 1] and decoder.done
    early = Decoder(model, use_plan=False).prefill(ids, max_new_tokens=10)
    early.step(), early.step()
    assert early.fed == 1 and not early.done  # the second token waits to be fed by a step that never comes


def test_rows_joining_and_leaving_decode_as_they_would_alone():
    model = tiny_model()
    prompts = [torch.randint(0, 64, (n,)).tolist() for n in (6, 3, 9)]
    alone = [generate(model, torch.tensor([p]), 6, use_plan=False)[0, len(p):].tolist() for p in prompts]
    batch = Decoder(model, use_plan=False).prefill(prompts[:1])
    got = [[int(batch.step()[0])], [], []]
    later = Decoder(model, use_plan=False).prefill(prompts[1:])
    for row, token in zip((1, 2), later.step().tolist()):
        got[row].append(token)
    batch.join(later)
    rows = [0, 1, 2]
    for step in range(5):
        if step == 3:  # the longest prompt leaves: its leading columns are dropped
            batch.keep([0, 1])
            rows = [0, 1]
        for row, token in zip(rows, batch.step().tolist()):
            got[row].append(token)
    assert got[0] == alone[0] and got[1] == alone[1] and got[2] == alone[2][:4]
    assert batch.cache.seen_tokens == batch.mask.shape[1] == 6 + 5


def test_a_row_continued_from_elsewhere_feeds_its_chosen_token_first():
    model = tiny_model()
    prompt = torch.randint(0, 64, (5,)).tolist()
    want = generate(model, torch.tensor([prompt]), 6, use_plan=False)[0, 5:].tolist()
    resumed = Decoder(model, use_plan=False).prefill([prompt + want[:2]], next_tokens=torch.tensor([want[2]]))
    assert [int(resumed.step()[0]) for _ in range(3)] == want[3:]


def test_only_rows_of_the_forward_path_with_their_next_token_picked_can_join():
    model = tiny_model()
    ids = torch.randint(0, 64, (1, 5))
    planned = Decoder(model).prefill(ids, max_new_tokens=4)
    planned.step()
    other = Decoder(model, use_plan=False).prefill(ids)
    with pytest.raises(CannotBatch, match="model's forward"):
        planned.join(other)  # the plan's buffers hold the rows, not the cache
    other.step()
    unpicked = Decoder(model, use_plan=False).prefill(ids)
    with pytest.raises(CannotBatch, match="next token picked"):
        other.join(unpicked)
