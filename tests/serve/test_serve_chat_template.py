"""`/v1/chat/completions` renders the conversation with the served tokenizer's chat template, and
`slmlab serve` serves a LoRA adapter folder (merged into its base by the one loader)."""

from __future__ import annotations

import openai
import pytest
import torch

from serve_helpers import build_checkpoint, running_server
from slmlab.data.chat import render_chat_text, render_plain
from slmlab.data.tokenizers import byte_tokenizer
from slmlab.generation import SamplingConfig, generate
from slmlab.train.lora import LoraSpec, add_lora, save_adapter
from slmlab.train.saved import load_for_inference

pytest.importorskip("peft")

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
            "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again?"}]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A LoRA adapter folder (non-zero B) on a tiny Lumen, its tokenizer carrying TEMPLATE."""
    root = tmp_path_factory.mktemp("serve-chat")
    base = build_checkpoint("lumen", root / "base")
    model = load_for_inference(base, "cpu").model
    peft_model = add_lora(model, LoraSpec(r=2, alpha=4.0), base)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    folder = root / "adapter"
    save_adapter(peft_model, folder)
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def test_chat_endpoint_uses_the_tokenizers_template(adapter):
    loaded = load_for_inference(adapter, "cpu")
    prompt = render_chat_text(loaded.tokenizer, MESSAGES)
    assert prompt == "<|system|>Be brief.<|user|>Hello there<|assistant|>Hi.<|user|>Again?<|assistant|>"
    assert prompt != render_plain(MESSAGES)
    ids = torch.tensor([loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    out = generate(loaded.model, ids, 10, SamplingConfig(0.0))  # the merged adapter, greedy, in this process
    want = loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    with running_server(adapter, "--max-batch", "2") as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        answer = client.chat.completions.create(model="adapter", messages=MESSAGES, max_tokens=10, temperature=0)
        assert answer.usage.prompt_tokens == ids.shape[1] == len(prompt.encode())  # the template's prompt, byte ids
        assert answer.choices[0].message.content == want
        streamed = client.chat.completions.create(model="adapter", messages=MESSAGES, max_tokens=10, temperature=0,
                                                  stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == want
