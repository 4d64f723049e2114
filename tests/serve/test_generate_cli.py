"""opforge generate: text through a tokenizer, the summary lines."""
from __future__ import annotations

import json
import os

import pytest

from opforge.cli import main
from opforge.models.testing import write_tiny_checkpoint
from opforge.serve import generate


def test_generate_with_token_ids(capsys):
    assert main(["generate", write_tiny_checkpoint(), "--prompt-ids", "5,6,7", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "prefill: 3 tokens" in out and "decode:" in out and "paged_attention[" in out


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


def _refused_before_loading(monkeypatch, argv, capsys):
    """Run ``opforge generate argv``; the loader must not be reached. Returns stderr."""
    import opforge.models.loader as loader

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")
    monkeypatch.setattr(loader, "load", no_load)
    assert main(["generate"] + argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err     # one line
    return err


@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", "5,99999"], "token id 99999 is outside the vocabulary [0, 64)"),
    (["--prompt-ids", "5,-1"], "token id -1 is outside the vocabulary [0, 64)"),
    (["--prompt-ids", "5", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--prompt-ids", "5", "--top-k", "0"], "--top-k must be >= 1, got 0"),
    (["--prompt-ids", "5", "--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--prompt-ids", "5", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--prompt-ids", "5", "--temperature", "-1"], "--temperature must be >= 0 (0 is greedy), got -1.0"),
    (["--prompt-ids", "5", "--temperature", "nan"], "--temperature must be >= 0"),
    (["--prompt-ids", "5", "--device", "nosuchdevice"], "--device nosuchdevice"),
    (["--prompt-ids", "1,2,3,4,5", "--max-seq-len", "4"], "the prompt alone (5 tokens) + --max-new-tokens (64) exceeds --max-seq-len (4)"),
    (["--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--max-seq-len", "10"], "exceeds --max-seq-len (10)"),
    (["--prompt-ids", "5", "--max-new-tokens", "many"], "argument --max-new-tokens: invalid int value: 'many'"),
    (["--prompt-ids", "5", "--group-size", "48"], "argument --group-size: invalid choice: 48"),
    (["--prompt-ids", "5", "--quantize", "int3"], "argument --quantize: invalid choice: 'int3'"),
    (["--prompt-ids", "5", "--no-such-option"], "unrecognized arguments: --no-such-option"),
])
def test_a_bad_argument_is_refused_in_one_line_before_loading(args, message, monkeypatch, capsys):
    err = _refused_before_loading(monkeypatch, [write_tiny_checkpoint()] + args, capsys)
    assert err.startswith("opforge generate: error: ") and message in err, err


def test_a_missing_or_incomplete_model_directory_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    err = _refused_before_loading(monkeypatch, [str(tmp_path / "absent"), "--prompt-ids", "5"], capsys)
    assert f"MODEL {tmp_path / 'absent'} does not exist" in err
    err = _refused_before_loading(monkeypatch, [str(tmp_path), "--prompt-ids", "5"], capsys)
    assert "has no config.json" in err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    err = _refused_before_loading(monkeypatch, [str(tmp_path), "--prompt-ids", "5"], capsys)
    assert "model_type 'gpt2' is not supported" in err


def test_help_gives_every_option_its_meaning_and_default(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["generate", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option, default in [("--max-new-tokens", "(default: 64)"), ("--temperature", "(default: 0.0)"),
                            ("--top-k", "(default: all)"), ("--top-p", "(default: 1, all)"),
                            ("--quantize", "default: stored"), ("--group-size", "(default: 128)"),
                            ("--quantize-head", "(default: dense)"), ("--max-seq-len", "(default: 4096)"),
                            ("--device", "(default: CUDA, then MPS, then CPU)"), ("--no-graphs", "(default: graphs"),
                            ("--readback", "(default: 1)")]:
        assert option in text and default in text, (option, default)
    assert "MODEL a Hugging Face layout directory" in text and "or a GGUF file" in text


def test_quantize_says_what_stays_dense_and_group_size_chooses(capsys):
    """TINY_LLAMA's projections have input dimensions 32 and 64: group 128 divides none of them."""
    path = write_tiny_checkpoint()
    run = ["generate", path, "--prompt-ids", "5,6", "--max-new-tokens", "2", "--device", "cpu", "--quantize", "int8"]
    assert main(run) == 0                                  # on the CPU every step is traced (no graph replays)
    out, err = capsys.readouterr()
    assert "leaves these projections dense" in err and "q|k|v (32)" in err and "down (64)" in err
    assert "--group-size 32 quantizes them all" in err
    assert "UserWarning" not in err                       # said once, by the command, with the advice
    assert _dense_linear_calls(out) == 2 * 9               # 2 steps x (4 projections x 2 layers + the head)
    assert main(run + ["--group-size", "32"]) == 0
    out, err = capsys.readouterr()
    assert "dense" not in err
    assert _dense_linear_calls(out) == 2                   # the output head only


def _dense_linear_calls(out: str) -> int:
    """Traced calls of dense-weight ``linear`` kernels in the command's kernel summary."""
    import re
    return sum(int(n) for n in re.findall(r"linear\[\w+/dense\w*\] x(\d+)", out))


def test_the_library_refuses_what_the_command_refuses():
    from opforge.models.testing import tiny_decoder
    model = tiny_decoder()
    for kwargs, message in [({"input_ids": [5, -1]}, "input_ids: token id -1"),
                            ({"input_ids": [5, 64]}, "input_ids: token id 64"),
                            ({"input_ids": [5], "temperature": -1.0}, "temperature must be >= 0"),
                            ({"input_ids": [5], "temperature": 1.0, "top_k": 0}, "top_k must be >= 1"),
                            ({"input_ids": [5], "temperature": 1.0, "top_p": 0.0}, "top_p must be in (0, 1]"),
                            ({"input_ids": [5], "max_new_tokens": 0}, "max_new_tokens must be >= 1")]:
        kwargs = {"max_new_tokens": 4, **kwargs}
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            generate(model, kwargs.pop("input_ids"), kwargs.pop("max_new_tokens"), **kwargs)
