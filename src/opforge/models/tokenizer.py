"""A checkpoint's tokenizer and chat template: a Hugging Face directory's ``tokenizer.json`` and
``tokenizer_config.json`` (or ``chat_template.jinja``), or a GGUF file's metadata."""
from __future__ import annotations

import json
import os
from typing import Any, Optional, Union

from .gguf import is_gguf, open_checkpoint


def hf_tokenizer(path: str) -> tuple[Any, Optional[str]]:
    """A Hugging Face directory's ``tokenizer.json`` as a ``tokenizers.Tokenizer`` (None without the
    file or the package) and the chat template of ``tokenizer_config.json`` or ``chat_template.jinja``.

    Example:
        >>> from opforge.models.testing import write_tiny_checkpoint
        >>> hf_tokenizer(write_tiny_checkpoint())
        (None, None)
    """
    tokenizer = None
    file = os.path.join(path, "tokenizer.json")
    if os.path.exists(file):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            Tokenizer = None
        tokenizer = Tokenizer.from_file(file) if Tokenizer is not None else None
    template = None
    config_file = os.path.join(path, "tokenizer_config.json")
    if os.path.exists(config_file):
        with open(config_file) as f:
            template = json.load(f).get("chat_template")
    jinja = os.path.join(path, "chat_template.jinja")
    if template is None and os.path.exists(jinja):
        with open(jinja) as f:
            template = f.read()
    return tokenizer, template if isinstance(template, str) else None


def checkpoint_tokenizer(path: Union[str, os.PathLike]) -> tuple[Any, Optional[str]]:
    """``(tokenizer, chat_template)`` of a GGUF file or a Hugging Face directory (None where absent).

    Example:
        >>> from opforge.models.testing import write_tiny_checkpoint
        >>> checkpoint_tokenizer(write_tiny_checkpoint())
        (None, None)
    """
    if is_gguf(path):
        checkpoint = open_checkpoint(path)
        return checkpoint.tokenizer, checkpoint.chat_template
    return hf_tokenizer(os.fspath(path))
