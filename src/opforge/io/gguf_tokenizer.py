"""A ``tokenizers.Tokenizer`` from a GGUF file's ``tokenizer.ggml.*`` metadata, and its chat template.

Two vocabulary kinds (``tokenizer.ggml.model``):

* ``gpt2``: byte-level BPE (Llama 3, Qwen2, SmolLM, GPT-2): tokens spelled in the byte alphabet,
  the file's merges, and the text split before BPE the way the vocabulary was trained, chosen by
  ``tokenizer.ggml.pre`` (``PRE_SPLITS``; an unknown name gets GPT-2's split).
* ``llama``: SentencePiece BPE (Llama 2, Mistral): ``\u2581`` for spaces, byte fallback for
  characters outside the vocabulary, merges recovered from the tokens' scores (a token made of
  two tokens is a merge, ranked by its score).

Tokens the file marks as control (type 3) or user-defined (type 4) are matched whole in the
text (``<|im_start|>`` stays one token). ``tokenizer.ggml.add_bos_token`` adds the BOS token
in front of every encoded text.

Example:
    >>> from opforge.io.gguf_tokenizer import tokenizer_from_metadata
    >>> meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab", "<s>"],
    ...         "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.token_type": [1, 1, 1, 3]}
    >>> tokenizer_from_metadata(meta).encode("abab<s>").ids
    [2, 2, 3]
"""
from __future__ import annotations

from typing import Any, Optional

_CONTRACTIONS = r"'s|'t|'re|'ve|'m|'ll|'d"
_GPT2 = _CONTRACTIONS + r"| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:" + _CONTRACTIONS + r")|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:" + _CONTRACTIONS + r")|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

#: ``tokenizer.ggml.pre`` -> (regexes applied in order, each isolating its matches; BPE ignores
#: merges for a piece that is itself a token). Names as llama.cpp's converter writes them.
PRE_SPLITS: dict[str, tuple[tuple[str, ...], bool]] = {
    "gpt2": ((_GPT2,), False), "default": ((_GPT2,), False),
    "smollm": ((r"\p{N}", _GPT2), False),               # every digit alone, then GPT-2's split
    "llama-bpe": ((_LLAMA3,), True), "llama3": ((_LLAMA3,), True), "llama-v3": ((_LLAMA3,), True),
    "smaug-bpe": ((_LLAMA3,), True), "dbrx": ((_LLAMA3,), False),
    "qwen2": ((_QWEN2,), False), "deepseek-r1-qwen": ((_QWEN2,), False),
}

_CONTROL, _USER_DEFINED, _BYTE = 3, 4, 6


class TokenizerMetadataError(ValueError):
    """The file's tokenizer metadata describes a tokenizer this module does not build (named)."""


def _byte_level(meta: dict[str, Any]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    pre = meta.get("tokenizer.ggml.pre", "default")
    splits, ignore_merges = PRE_SPLITS.get(pre, PRE_SPLITS["default"])
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(meta: dict[str, Any]):
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokens = meta["tokenizer.ggml.tokens"]
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token, score, kind in zip(tokens, scores, types):
        if kind != 1 or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                merges.append((score, vocab[token], vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2], m[3]))       # best merge first; ties by ids
    unk_id = meta.get("tokenizer.ggml.unknown_token_id", 0)
    tok = Tokenizer(models.BPE(vocab, [(m[4], m[5]) for m in merges], unk_token=tokens[unk_id], fuse_unk=True,
                               byte_fallback=True))
    steps = [normalizers.Replace(" ", "\u2581")]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    strip = [decoders.Strip(" ", 1, 0)] if meta.get("tokenizer.ggml.add_space_prefix", True) else []
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()] + strip)
    return tok


def tokenizer_from_metadata(meta: dict[str, Any]):
    """The tokenizer a GGUF file's metadata describes, or None when it has no vocabulary.

    Needs the ``tokenizers`` package (None without it). Raises ``TokenizerMetadataError`` for a
    ``tokenizer.ggml.model`` other than ``gpt2`` and ``llama``.

    Example:
        >>> meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "\u2581", "h", "i", "\u2581h"],
        ...         "tokenizer.ggml.scores": [0, 0, 0, 0, -1.0], "tokenizer.ggml.token_type": [2, 1, 1, 1, 1]}
        >>> tok = tokenizer_from_metadata(meta)
        >>> tok.encode("hi").tokens, tok.decode(tok.encode("hi").ids)
        (['\u2581h', 'i'], 'hi')
    """
    if "tokenizer.ggml.tokens" not in meta:
        return None
    try:
        import tokenizers
    except ImportError:
        return None
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        tok = _byte_level(meta)
    elif kind == "llama":
        tok = _sentencepiece(meta)
    else:
        raise TokenizerMetadataError(f"tokenizer.ggml.model {kind!r} is not supported (gpt2: byte-level BPE, "
                                     "llama: SentencePiece BPE)")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or []
    whole = [tokenizers.AddedToken(t, special=k == _CONTROL, normalized=False)
             for t, k in zip(tokens, types) if k in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens([t for t in whole if t.special])
    tok.add_tokens([t for t in whole if not t.special])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", kind == "llama") and bos is not None:
        from tokenizers import processors
        name = tokens[bos]
        tok.post_processor = processors.TemplateProcessing(single=f"{name} $A", pair=f"{name} $A {name} $B",
                                                           special_tokens=[(name, bos)])
    return tok


def chat_template_from_metadata(meta: dict[str, Any]) -> Optional[str]:
    """The file's Jinja chat template (``tokenizer.chat_template``), or None.

    Example:
        >>> chat_template_from_metadata({"tokenizer.chat_template": "{{ messages }}"})
        '{{ messages }}'
    """
    template = meta.get("tokenizer.chat_template")
    return template if isinstance(template, str) else None
