"""`slmlab eval RUN --tasks`: lm-evaluation-harness tasks against an slmlab model.

A two-item multiple-choice task is built here (a JSON-lines dataset and a task YAML in a temporary
folder, ``dataset_path: json``: no download), and lm-eval's accuracy and per-choice log-likelihoods
are checked against a hand computation with the same model.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from slmlab import cli

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the optional extra `eval`")

QUESTIONS = [
    {"question": "The capital of France is", "choices": ["Paris", "a fish", "blue"]},
    {"question": "Two plus two equals", "choices": ["four", "seven", "a window"]},
]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny lumen model with the byte tokenizer, saved as a model folder (one byte = one token,
    so context and continuation tokenise the same apart or together)."""
    from slmlab.data import get_tokenizer
    from slmlab.models.registry import resolve_model_spec

    folder = tmp_path_factory.mktemp("model")
    tokenizer = get_tokenizer("byte")
    fam, preset = resolve_model_spec("lumen:lumen-tiny")
    torch.manual_seed(0)
    model = fam.model_class(fam.make_config(preset, vocab_size=len(tokenizer))).eval()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder, model, tokenizer


def hand_loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | <bos> context), summed over the continuation's tokens."""
    ctx = [tokenizer.bos_token_id, *tokenizer(context, add_special_tokens=False)["input_ids"]]
    cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]
    return sum(float(logp[len(ctx) - 1 + i, tok]) for i, tok in enumerate(cont))


@pytest.fixture(scope="module")
def task_dir(saved_model, tmp_path_factory):
    """The task folder: gold answers chosen so the model is right on the first item and wrong on the
    second by the hand computation, so the expected accuracy is exactly 0.5."""
    _, model, tokenizer = saved_model
    folder = tmp_path_factory.mktemp("tasks")
    rows, expected = [], {}
    for i, item in enumerate(QUESTIONS):
        scores = [hand_loglikelihood(model, tokenizer, item["question"], " " + c) for c in item["choices"]]
        best = max(range(len(scores)), key=scores.__getitem__)
        label = best if i == 0 else min(range(len(scores)), key=scores.__getitem__)
        rows.append({**item, "label": label})
        expected[item["question"]] = scores
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "tiny_mc.yaml").write_text(
        "task: slmlab_tiny_mc\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        f"  data_files:\n    test: {data}\n"
        f"  cache_dir: {folder / 'hf-datasets'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: choices\n"
        "doc_to_target: label\n"
        "metric_list:\n  - metric: acc\n"
    )
    return folder, expected


def test_accuracy_matches_hand_computed_loglikelihoods(saved_model, task_dir, capsys):
    folder, model, _ = saved_model
    tasks, _ = task_dir
    code = cli.main(["eval", str(folder), "--tasks", "slmlab_tiny_mc", "--include-path", str(tasks), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["results"]["slmlab_tiny_mc"]["acc,none"] == pytest.approx(0.5)
    assert out["context"] == model.config.max_position_embeddings  # no run.yaml beside the weights


def test_every_choice_scores_as_computed_by_hand(saved_model, task_dir):
    from slmlab.evaluate.tasks import run_tasks

    _, model, tokenizer = saved_model
    tasks, expected = task_dir
    results = run_tasks(model, tokenizer, "slmlab_tiny_mc", max_length=64, include_path=tasks, log_samples=True,
                        batch_size=2)
    samples = results["samples"]["slmlab_tiny_mc"]
    assert len(samples) == 2
    for sample in samples:
        got = [float(r[0][0]) for r in sample["resps"]]
        assert got == pytest.approx(expected[sample["doc"]["question"]], abs=1e-4)


def test_rolling_loglikelihood_scores_every_token_once_in_windows(saved_model):
    """A document longer than the window: the first window reads <bos> + 15 tokens, each later one
    predicts the next (up to) 16 tokens from the 16 before them, and the last keeps a full context."""
    from lm_eval.api.instance import Instance

    from slmlab.evaluate.harness import SlmlabLM

    _, model, tokenizer = saved_model
    text = "To be, or not to be, that is the question."
    lm = SlmlabLM(model, tokenizer, max_length=16, batch_size=3)
    (got,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])

    def last_k(inputs, targets, k):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([inputs])).logits.float(), -1)[0]
        return sum(float(logp[p, targets[p]]) for p in range(len(targets) - k, len(targets)))

    t = tokenizer(text, add_special_tokens=False)["input_ids"]
    want, done = last_k([tokenizer.bos_token_id, *t[:15]], t[:16], 16), 16
    while done < len(t):
        k = min(len(t) - done, 16)
        end = done + k
        want, done = want + last_k(t[end - 17 : end - 1], t[end - 16 : end], k), end
    assert len(t) == 42 and got == pytest.approx(want, abs=1e-3)


def test_generate_until_stops_at_the_stop_string(saved_model):
    from lm_eval.api.instance import Instance

    from slmlab.evaluate.harness import SlmlabLM
    from slmlab.generation import generate

    _, model, tokenizer = saved_model
    lm = SlmlabLM(model, tokenizer, max_length=64)
    prompt = "Q: hello\nA:"
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False)["input_ids"]]])
    full = tokenizer.decode(generate(model, ids, 12)[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    stop = full[3:5] if len(full) >= 5 and full[3:5] not in full[:3] else "\u2603"
    (text,) = lm.generate_until([Instance("generate_until", {}, (prompt, {"until": [stop], "max_gen_toks": 12}), 0)])
    assert text == full.split(stop, 1)[0]


def test_unknown_task_names_the_include_path(saved_model, task_dir, capsys):
    folder, _, _ = saved_model
    tasks, _ = task_dir
    assert cli.main(["eval", str(folder), "--tasks", "slmlab_no_such_task", "--include-path", str(tasks)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slmlab eval: error: Tasks not found: slmlab_no_such_task")
    assert "--include-path" in err


def test_missing_extra_names_the_pip_command(saved_model, monkeypatch, capsys):
    folder, _, _ = saved_model
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now raises ImportError
    assert cli.main(["eval", str(folder), "--tasks", "arc_easy"]) == 2
    assert 'pip install "slmlab[eval]"' in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--limit", "2"], "add --tasks"),
        (["--tasks", "x", "--limit", "-1"], "--limit must be positive"),
        (["--tasks", "x", "--limit", "2.5"], "must be an integer"),
        (["--tasks", " , "], "names no task"),
        (["--tasks", "x", "--include-path", "/no/such/folder"], "is not a folder"),
    ],
)
def test_bad_task_arguments_are_refused(saved_model, extra, message, capsys):
    folder, _, _ = saved_model
    assert cli.main(["eval", str(folder), *extra]) == 2
    assert message in capsys.readouterr().err
