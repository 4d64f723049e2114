"""A tiny character-level tokenizer (64 ids, the tiny checkpoint's vocabulary) and a ChatML template."""
from __future__ import annotations

import json
import os

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 \n.,!?'-:ABCDEFGHIJKLMN")
VOCAB = {t: i for i, t in enumerate(SPECIALS + CHARS)}
assert len(VOCAB) == 64

#: ChatML with the constructs real templates use: a system default, loop controls, tojson, raise_exception.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nyou are tiny.<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(directory: str, chat_template: str = CHAT_TEMPLATE) -> str:
    """Write tokenizer.json (characters, <s> prepended) and tokenizer_config.json into ``directory``."""
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": VOCAB[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t in SPECIALS],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": VOCAB, "unk_token": "<unk>"},
    }
    with open(os.path.join(directory, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    eos = {"__type": "AddedToken", "content": "</s>", "lstrip": False, "rstrip": False, "normalized": False,
           "single_word": False, "special": True}          # the way transformers writes an AddedToken
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": eos,
              "unk_token": "<unk>", "chat_template": chat_template, "model_max_length": 256}
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return directory
