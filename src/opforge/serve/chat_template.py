"""Chat templates: a checkpoint's jinja2 template turned into prompt text.

The template comes from the checkpoint directory (``chat_template.jinja``, else the
``chat_template`` field of ``tokenizer_config.json``: a string, or a list of named templates of
which ``"default"`` is used). It is rendered the way Hugging Face checkpoints expect: a sandboxed
jinja2 environment with ``trim_blocks`` and ``lstrip_blocks``, loop controls, a ``tojson`` filter
that keeps non-ASCII text and does not HTML-escape, ``raise_exception(message)`` and
``strftime_now(format)``, and the variables ``messages``, ``add_generation_prompt``, ``tools``,
``documents`` and the special tokens (``bos_token``, ``eos_token``, ...). ``{% generation %}``
blocks render their body.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

import jinja2
import jinja2.ext
import jinja2.sandbox

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """A chat template that does not parse, or that refuses the messages (``raise_exception``)."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (marks assistant text for training masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Optional[tuple[str, str]] = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _token_text(value: Any) -> Optional[str]:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class ChatTemplate:
    """A parsed chat template and the special tokens it may refer to.

    Example:
        >>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        ...                  "{% if add_generation_prompt %}<assistant>{% endif %}", {"bos_token": "<s>"})
        >>> t.render([{"role": "user", "content": "hi"}])
        '<user>hi<assistant>'
    """

    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template does not parse: {e}") from e

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: Optional[list[dict[str, Any]]] = None, **extra: Any) -> str:
        """The prompt text for ``messages`` (dicts with ``role`` and ``content``).

        Raises:
            ChatTemplateError: the template raised (``raise_exception``) or failed on the messages.
        """
        variables = {**self.special_tokens, **extra}
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         tools=tools, documents=None, **variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template failed on these messages: {e}") from e
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise ChatTemplateError(f"the chat template failed on these messages: {type(e).__name__}: {e}") from e


def _pick(template: Any, path: str) -> Optional[str]:
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):     # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
        raise ChatTemplateError(f"{path}: named chat templates {sorted(map(str, named))} and none is 'default'")
    raise ChatTemplateError(f"{path}: chat_template must be a string or a list of named templates, "
                            f"got {type(template).__name__}")


def load_chat_template(model_dir: str) -> Optional[ChatTemplate]:
    """The chat template of a Hugging Face checkpoint directory, or None when it has none.

    Example:
        >>> import json, os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        ...     json.dump({"bos_token": {"content": "<s>"}, "chat_template": "{{ bos_token }}{{ messages[0].content }}"}, f)
        >>> load_chat_template(d).render([{"role": "user", "content": "hi"}])
        '<s>hi'
    """
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    config: dict[str, Any] = {}
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            try:
                config = json.load(f)
            except json.JSONDecodeError as e:
                raise ChatTemplateError(f"{config_path} is not valid JSON: {e}") from e
    special = {name: text for name in _SPECIAL_TOKENS if (text := _token_text(config.get(name))) is not None}
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return ChatTemplate(f.read(), special)
    source = _pick(config.get("chat_template"), config_path)
    return ChatTemplate(source, special) if source else None


def _special_tokens_of(tokenizer: Any, eos_token_ids: tuple[int, ...]) -> dict[str, str]:
    """bos/eos token texts from a ``tokenizers.Tokenizer``: BOS is what it puts before an empty text."""
    special: dict[str, str] = {}
    if tokenizer is None:
        return special
    added = tokenizer.encode("").ids
    if added and (text := tokenizer.id_to_token(added[0])) is not None:
        special["bos_token"] = text
    if eos_token_ids and (text := tokenizer.id_to_token(eos_token_ids[0])) is not None:
        special["eos_token"] = text
    return special


def chat_template_for(path: str, model: Any = None, tokenizer: Any = None) -> Optional[ChatTemplate]:
    """The chat template to serve ``path`` with: a directory's own files (``load_chat_template``),
    else the template text a loaded model carries (``model.chat_template``, e.g. from a GGUF
    file's metadata) with its special tokens read from ``tokenizer``.

    Example:
        >>> from types import SimpleNamespace
        >>> model = SimpleNamespace(chat_template="{{ eos_token }}", config=SimpleNamespace(eos_token_ids=(2,)))
        >>> chat_template_for("/not/a/dir.gguf", model).render([])
        ''
    """
    if os.path.isdir(path):
        template = load_chat_template(path)
        if template is not None:
            return template
    source = getattr(model, "chat_template", None)
    if not isinstance(source, str) or not source:
        return None
    eos = tuple(getattr(getattr(model, "config", None), "eos_token_ids", ()) or ())
    return ChatTemplate(source, _special_tokens_of(tokenizer, eos))
