"""Chat templates render exactly as transformers' ``apply_chat_template`` renders them."""
import json
import os
import tempfile

import pytest
from transformers import AutoTokenizer

from opforge.serve.chat_template import ChatTemplate, ChatTemplateError, load_chat_template

from tiny_tokenizer import CHAT_TEMPLATE, write_tokenizer

pytestmark = pytest.mark.cpu_only     # the HTTP side; the model runs on the CPU in every test here

#: Llama-3-style: bos, headers, tojson of tools, loop.first/last, namespace, a default system date.
LLAMA3_STYLE = (
    "{{- bos_token }}{%- set ns = namespace(sys='') %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set ns.sys = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n"
    "{%- if tools is not none %}Tools: {{ tools | tojson(indent=2) }}\n{%- endif %}"
    "Today: {{ strftime_now('%Y') | length }} digits\n{{ ns.sys }}<|eot_id|>"
    "{%- for m in messages %}{%- if loop.index0 > 7 %}{%- break %}{%- endif %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>"
    "{%- if loop.last and m['role'] == 'assistant' %}{{ eos_token }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)

MESSAGES = [
    {"role": "system", "content": "be brief \u00e9\u00e8 \U0001F600"},
    {"role": "user", "content": "  hi <b>there</b> & \"quoted\"  "},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "again"},
]


def _both(template: str) -> tuple:
    d = write_tokenizer(tempfile.mkdtemp(), chat_template=template)
    return load_chat_template(d), AutoTokenizer.from_pretrained(d)


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, LLAMA3_STYLE], ids=["chatml", "llama3-style"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_render_equals_transformers(template, add_generation_prompt, n):
    ours, hf = _both(template)
    messages = MESSAGES[-n:]
    expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected


def test_tools_tojson_equals_transformers():
    ours, hf = _both(LLAMA3_STYLE)
    tools = [{"type": "function", "function": {"name": "w\u00e9ather", "parameters": {"a": "<&>"}}}]
    expected = hf.apply_chat_template(MESSAGES[1:2], tools=tools, tokenize=False, add_generation_prompt=True)
    got = ours.render(MESSAGES[1:2], tools=tools)
    assert got == expected and "w\u00e9ather" in got and "<&>" in got


def test_raise_exception_is_a_chat_template_error():
    ours, hf = _both(CHAT_TEMPLATE)
    bad = [{"role": "tool", "content": "x"}]
    with pytest.raises(Exception, match="unknown role tool"):
        hf.apply_chat_template(bad, tokenize=False)
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        ours.render(bad)


def test_named_templates_and_jinja_file():
    d = write_tokenizer(tempfile.mkdtemp())
    path = os.path.join(d, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}]
    with open(path, "w") as f:
        json.dump(config, f)
    assert load_chat_template(d).render([]) == "D</s>"
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write("J{{ bos_token }}")
    assert load_chat_template(d).render([]) == "J<s>"


def test_missing_and_broken_templates():
    assert load_chat_template(tempfile.mkdtemp()) is None
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="failed on these messages"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render([{"role": "user", "content": "a"}])


def test_generation_block_renders_its_body():
    t = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}")
    assert t.render([{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]) == "[x][y]"


def test_a_models_own_template_gets_its_special_tokens_from_the_tokenizer():
    from types import SimpleNamespace
    from tokenizers import Tokenizer
    from opforge.serve.chat_template import chat_template_for
    d = write_tokenizer(tempfile.mkdtemp())
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    model = SimpleNamespace(chat_template=CHAT_TEMPLATE, config=SimpleNamespace(eos_token_ids=(2,)))
    ours = chat_template_for(os.path.join(d, "model.gguf"), model, tok)      # a file: the model's template
    hf = AutoTokenizer.from_pretrained(d)
    assert ours.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    assert ours.render(MESSAGES) == hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert chat_template_for(tempfile.mkdtemp(), SimpleNamespace(chat_template=None), tok) is None
