"""Tokenizers built from GGUF metadata: a SentencePiece-style vocabulary (Llama 2 / Mistral
files: scores, byte fallback, no merges) written into a tiny GGUF file, against transformers'
tokenizer for the same file; byte-level BPE is checked on the trained model in
tests/models/test_gguf_model.py."""
from __future__ import annotations

import os

import pytest

from opforge.io.gguf import open_gguf
from opforge.io.gguf_tokenizer import TokenizerMetadataError, tokenizer_from_metadata
from opforge.models.testing import TINY_LLAMA, random_weights, write_gguf

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")


def _spm_metadata() -> dict:
    """<unk> <s> </s>, the 256 byte tokens, letters and punctuation, then pieces of a few words,
    each scored by its order (earlier: merged first)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for i, t in enumerate(["\u2581"] + list("abcdefghijklmnopqrstuvwxyz.,!?")):
        tokens.append(t), types.append(1), scores.append(-1000.0 - i)
    pieces: list[str] = []
    for word in ["the", "in", "er", "he", "an", "ing", "and", "hello", "world", "is", "it"]:
        for spelled in (word, "\u2581" + word):
            pieces += [spelled[:cut] for cut in range(2, len(spelled) + 1)
                       if spelled[:cut] not in tokens and spelled[:cut] not in pieces]
    for i, t in enumerate(pieces):
        tokens.append(t), types.append(1), scores.append(-float(i))
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def test_sentencepiece_vocabulary_equals_transformers(tmp_path):
    meta = _spm_metadata()
    config = dict(TINY_LLAMA, vocab_size=len(meta["tokenizer.ggml.tokens"]))
    path = write_gguf(str(tmp_path / "spm.gguf"), config, random_weights(config), metadata=meta)
    ours = tokenizer_from_metadata(open_gguf(path).metadata)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=os.path.basename(path))
    for text in ["hello world", "the thing is in the inn", "Ünïcode ☃ and emoji 🙂", "a  b\n\nc", "hello, world!"]:
        ids = ours.encode(text).ids
        # the pieces equal transformers'; whether its tokenizer adds BOS changed across its releases
        assert ids[1:] == theirs(text, add_special_tokens=False)["input_ids"], text
        assert ids[0] == 1                                    # BOS, as llama.cpp adds to SentencePiece text
        assert ours.decode(ids) == text
    # a leading space: SentencePiece (and llama.cpp) prefix one more "\u2581" whatever the text starts
    # with, and decoding gives the text back; transformers' tokenizer does not prefix it there
    ids = ours.encode(" hello").ids
    assert ours.id_to_token(ids[1]) == "\u2581" and ours.decode(ids) == " hello"


def test_unknown_tokenizer_model_is_named():
    with pytest.raises(TokenizerMetadataError, match="tokenizer.ggml.model 'bert' is not supported"):
        tokenizer_from_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    assert tokenizer_from_metadata({"general.architecture": "llama"}) is None
