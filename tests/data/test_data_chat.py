"""Chat templates, chat files and the chat data source (src/slmlab/data/chat*.py)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from slmlab.data.chat import (
    DEFAULT_CHAT_TEMPLATE,
    encode_conversation,
    ensure_chat_template,
    fit_history,
    prompt_ids,
    render_chat_text,
    render_plain,
)
from slmlab.data.chat_data import builtin_chat, load_chat, read_chat_jsonl, write_chat_jsonl
from slmlab.data.chat_source import VALIDATION_EVERY, ChatSource
from slmlab.data.tokenizers import byte_tokenizer, train_bpe
from slmlab.serve.chat import render_chat

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Reverse abc."},
     {"role": "assistant", "content": "cba"}],
    [{"role": "developer", "content": "Rules: none"}, {"role": "user", "content": "multi\nline"},
     {"role": "assistant", "content": " spaced  answer \n"}],
]


@pytest.fixture(scope="module", params=["byte", "bpe"])
def tokenizer(request):
    if request.param == "byte":
        return byte_tokenizer()
    texts = [render_plain(c, add_generation_prompt=False) for c in builtin_chat(300)]
    return train_bpe(texts, vocab_size=400)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_default_template_renders_the_plain_layout(tokenizer, conversation):
    for gen in (True, False):
        text = render_chat_text(tokenizer, conversation, add_generation_prompt=gen)
        assert text == render_plain(conversation, add_generation_prompt=gen)
        assert text == tokenizer.apply_chat_template(conversation, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False,
                                                     add_generation_prompt=gen)
    assert render_chat(conversation) == render_chat(conversation, tokenizer)  # the server: no tokenizer, or its template
    assert render_plain(CONVERSATIONS[1][:3]) == "System: Be terse.\nUser: Hi!\nAssistant: Hello.\nAssistant:"


def test_template_round_trips_through_save_pretrained(tmp_path, tokenizer):
    tok = PreTrainedTokenizerFast.from_pretrained(_saved(tokenizer, tmp_path / "plain"))
    assert tok.chat_template is None
    ensure_chat_template(tok)
    again = PreTrainedTokenizerFast.from_pretrained(_saved(tok, tmp_path / "with"))
    assert again.chat_template == DEFAULT_CHAT_TEMPLATE
    for conversation in CONVERSATIONS:  # transformers' own apply_chat_template, reading the saved template
        assert again.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True) == render_plain(conversation)
        assert prompt_ids(again, conversation) == again.apply_chat_template(conversation, tokenize=True,
                                                                           add_generation_prompt=True, return_dict=True)["input_ids"]


def test_a_tokenizers_own_template_wins(tmp_path):
    tok = byte_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{% if m['role'] == 'assistant' %}{% generation %}"
                         "{{ m['content'] }}{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert render_chat_text(tok, CONVERSATIONS[0]) == "<user>What is 2 + 2?<assistant>4<assistant>"
    assert render_chat(CONVERSATIONS[0], tok) == "<user>What is 2 + 2?<assistant>4<assistant>"
    ids, scored = encode_conversation(tok, CONVERSATIONS[0])
    assert tok.decode([i for i, s in zip(ids, scored) if s]) == "4<eos>"
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # no generation blocks
    with pytest.raises(ValueError, match="generation"):
        encode_conversation(tok, CONVERSATIONS[0])


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_only_assistant_tokens_are_scored(tokenizer, conversation):
    ids, scored = encode_conversation(tokenizer, conversation)
    reference = tokenizer.apply_chat_template(conversation, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=True,
                                              return_dict=True, return_assistant_tokens_mask=True)
    assert ids == list(reference["input_ids"]) + [tokenizer.eos_token_id]
    assert scored == list(reference["assistant_masks"]) + [1]
    answers = "".join(f" {m['content']}\n" for m in conversation if m["role"] == "assistant")
    assert tokenizer.decode([i for i, s in zip(ids, scored) if s]) == answers + "<eos>"
    prompt_text = tokenizer.decode([i for i, s in zip(ids, scored) if not s])
    assert prompt_text == "".join(f"{render_plain([m], False)[:-1] if m['role'] != 'assistant' else 'Assistant:'}"
                                  + ("\n" if m["role"] != "assistant" else "") for m in conversation)


def test_no_assistant_turn_is_refused():
    with pytest.raises(ValueError, match="no assistant turn"):
        encode_conversation(byte_tokenizer(), [{"role": "user", "content": "hi"}])


BAD_LINES = [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"text": "hi"}', "neither 'messages' nor 'prompt'/'completion'"),
    ('{"messages": []}', "non-empty list"),
    ('{"messages": [{"role": "bot", "content": "x"}]}', r"messages\[0\].role must be one of"),
    ('{"messages": [{"role": "user", "content": 3}]}', r"messages\[0\].content must be a string"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
    ('{"prompt": "hi"}', "'completion' must be a string"),
    ('{"prompt": "hi", "completion": "yo", "system": 5}', "'system' must be a string"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_malformed_rows_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as err:
        read_chat_jsonl(path)
    assert str(err.value).startswith(f"{path}:3: ")


def test_chat_files_and_the_builtin_set(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": "2+2?", "completion": "4", "system": "Be terse."}) + "\n"
                    + json.dumps({"messages": CONVERSATIONS[1]}) + "\n")
    assert read_chat_jsonl(path) == [[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
                                      {"role": "assistant", "content": "4"}], CONVERSATIONS[1]]
    rows = builtin_chat()
    assert rows == builtin_chat() and len(rows) == 4000
    assert len({json.dumps(r) for r in rows}) == len(rows)  # distinct: held-out rows are unseen
    assert load_chat(str(write_chat_jsonl(rows, tmp_path / "made.jsonl"))) == rows == load_chat("builtin:chat")
    with pytest.raises(ValueError, match="builtin:chat"):
        load_chat("builtin:nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_chat(str(tmp_path / "missing.jsonl"))


def test_chat_source_batches(tokenizer):
    conversations = builtin_chat(60)
    source = ChatSource("builtin:chat", conversations, tokenizer, 256)
    assert {k: len(v) for k, v in source.rows.items()} == {"train": 54, "validation": 6}
    assert source.seq_len == 256 and source.bytes_per_token("validation") is None
    batch = next(source.eval_batches("validation", 6))
    for i, messages in enumerate(conversations[VALIDATION_EVERY - 1::VALIDATION_EVERY]):
        ids, scored = encode_conversation(tokenizer, messages)
        n = len(ids)
        assert batch["input_ids"][i, :n].tolist() == ids
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
        want = [t if s and p > 0 else -100 for p, (t, s) in enumerate(zip(ids, scored))]
        assert batch["labels"][i, :n].tolist() == want
        assert (batch["labels"][i, n:] == -100).all() and (batch["input_ids"][i, n:] == tokenizer.pad_token_id).all()
    # exact resume: the stream from step 3 is the uninterrupted stream's steps 3..
    whole = source.batches("train", 4, seed=7)
    first = [next(whole) for _ in range(6)]
    later = source.batches("train", 4, seed=7, step=3)
    for expected in first[3:]:
        got = next(later)
        assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_chat_source_cuts_long_rows_and_needs_two():
    tok = byte_tokenizer()
    long = [{"role": "user", "content": "x" * 50}, {"role": "assistant", "content": "y"}]
    source = ChatSource("s", [CONVERSATIONS[0]] * 3 + [long] + [CONVERSATIONS[0]] * 7, tok, 40)
    assert source.notes and "1 conversation(s) longer than block_size=40" in source.notes[0] and "1 dropped" in source.notes[0]
    assert (len(source.rows["train"]), len(source.rows["validation"])) == (9, 1)
    with pytest.raises(ValueError, match="at least 2"):
        ChatSource("s", [CONVERSATIONS[0]], tok, 40)


def test_fit_history_drops_the_oldest_turns_and_keeps_the_system_line():
    tok = byte_tokenizer()
    turns = [{"role": "user", "content": "a" * 20}, {"role": "assistant", "content": "b" * 20},
             {"role": "user", "content": "c" * 20}, {"role": "assistant", "content": "d" * 20},
             {"role": "user", "content": "new"}]
    full = len(prompt_ids(tok, [{"role": "system", "content": "S"}] + turns))
    ids, dropped = fit_history(tok, "S", turns, full - 1)
    assert dropped == 2 and turns[0]["content"] == "c" * 20
    assert ids == prompt_ids(tok, [{"role": "system", "content": "S"}] + turns) and len(ids) < full
    with pytest.raises(ValueError, match="send a shorter one"):
        fit_history(tok, "S", [{"role": "user", "content": "x" * 100}], 20)


def _saved(tok, folder):
    tok.save_pretrained(str(folder))
    return str(folder)
