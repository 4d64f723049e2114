"""Text in and out: encoding prompts, and decoding generated tokens one at a time.

Decoding token by token is not decoding each token alone: a character may span several tokens
(byte-level vocabularies split multi-byte UTF-8), and some tokenizers put a space before a word
only when it follows another. ``Detokenizer`` therefore decodes a short window of recent tokens
and releases text only once it no longer ends in an incomplete character (U+FFFD).

Example:
    >>> from opforge.serve.tokenizer import Detokenizer, byte_tokenizer
    >>> tok = byte_tokenizer()
    >>> ids = tok.encode("né", add_special_tokens=False).ids    # 'é' is two bytes: two tokens
    >>> d = Detokenizer(tok, [])
    >>> [d.add(i) for i in ids]
    ['n', '', 'é']
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

REPLACEMENT = "\ufffd"


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with the tokenizer's special tokens (a BOS where it adds one)."""
    return list(tokenizer.encode(text).ids)


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of ``ids``, special tokens skipped."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


class Detokenizer:
    """Incremental decoding of one sequence: ``add(token)`` returns the text it completes.

    Keeps two offsets into the token list: ``prefix`` (where the window decoded for context
    starts) and ``read`` (tokens before it are already released). The text of
    ``tokens[prefix:]`` minus the text of ``tokens[prefix:read]`` is new, unless it ends in an
    incomplete character, in which case it waits for the next token.
    """

    CONTEXT = 6   # prompt tokens kept as left context (a word boundary's spacing depends on them)

    def __init__(self, tokenizer: Any, prompt: Sequence[int]):
        self.tokenizer = tokenizer
        self.tokens = list(prompt[-self.CONTEXT:])
        self.prefix = 0
        self.read = len(self.tokens)

    def add(self, token: int) -> str:
        """Append ``token``; the text that became final with it ('' while a character is incomplete)."""
        self.tokens.append(int(token))
        before = decode(self.tokenizer, self.tokens[self.prefix:self.read])
        now = decode(self.tokenizer, self.tokens[self.prefix:])
        if now.endswith(REPLACEMENT):
            return ""
        new = now[len(before):]
        self.prefix, self.read = self.read, len(self.tokens)
        return new

    def flush(self) -> str:
        """Text still held back at the end of the sequence (an incomplete character, as U+FFFD)."""
        if self.read == len(self.tokens):
            return ""
        before = decode(self.tokenizer, self.tokens[self.prefix:self.read])
        now = decode(self.tokenizer, self.tokens[self.prefix:])
        self.prefix = self.read = len(self.tokens)
        return now[len(before):]


def byte_tokenizer() -> Any:
    """A tiny byte-level BPE tokenizer (256 byte tokens, no merges, ``<s>``=256, ``</s>``=257):
    enough to test text handling, multi-byte characters included.

    Example:
        >>> tok = byte_tokenizer()
        >>> tok.decode(tok.encode("hé!", add_special_tokens=False).ids)
        'hé!'
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {c: i for i, c in enumerate(byte_chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


def _byte_of(char: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's printable mapping)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    code = ord(char)
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def load_tokenizer(path: str) -> Optional[Any]:
    """A ``tokenizers.Tokenizer`` from ``path/tokenizer.json`` if there is one, else None.

    Example:
        >>> import tempfile
        >>> load_tokenizer(tempfile.mkdtemp()) is None
        True
    """
    import os
    file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
        return None
    from tokenizers import Tokenizer
    return Tokenizer.from_file(file)
