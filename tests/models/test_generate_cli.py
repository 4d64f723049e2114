"""opforge generate: text through a tokenizer, the summary lines."""
from __future__ import annotations

import json
import os

import pytest

from opforge.cli import main
from opforge.models.testing import write_tiny_checkpoint


def test_generate_with_token_ids(capsys):
    assert main(["generate", write_tiny_checkpoint(), "--prompt-ids", "5,6,7", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "prefill: 3 tokens" in out and "decode:" in out and "decode_attention[" in out


def test_readback_streams_the_same_tokens(capsys):
    path = write_tiny_checkpoint()
    printed = []
    for readback in ("1", "3"):
        assert main(["generate", path, "--prompt-ids", "5,6,7", "--max-new-tokens", "7", "--readback", readback]) == 0
        printed.append(capsys.readouterr().out.splitlines()[0])
    assert printed[0] == printed[1] and len(printed[0].split()) == 7
    assert main(["generate", path, "--prompt-ids", "5", "--readback", "0"]) == 2
    assert "--readback takes a number of decode steps >= 1, got 0" in capsys.readouterr().err


def test_generate_text_with_a_tokenizer(capsys):
    tokenizers = pytest.importorskip("tokenizers")
    path = write_tiny_checkpoint()
    vocab = {f"w{i}": i for i in range(64)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")     # joins words with spaces
    tok.save(os.path.join(path, "tokenizer.json"))
    assert main(["generate", path, "--prompt", "w5 w6 w7", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.split() and all(w.startswith("w") for w in first.split()), first


def test_generate_text_without_tokenizer_json_says_what_is_missing(capsys):
    assert main(["generate", write_tiny_checkpoint(), "--prompt", "hello"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [([], "give a prompt"),
                                           (["--prompt-ids", "1,x,3"], "comma-separated integers")])
def test_generate_without_a_usable_prompt_says_so(args, message, capsys):
    """No prompt at all, or ids that are not integers: exit 2 with a one-line reason (before loading)."""
    assert main(["generate", write_tiny_checkpoint()] + args) == 2
    assert message in capsys.readouterr().err
