"""``quantkit run`` end to end on the bundled model, and its errors (one line, exit 1 or 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.cli import main

GOLDEN = Path(__file__).parent / "data" / "run" / "golden.json"


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, ["run", *args], input=input)


def assert_one_line_error(result, code: int, needle: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    err = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert any(needle in ln for ln in err), result.stderr
    assert err[-1].startswith("Error:")


@pytest.mark.slow
def test_run_greedy_bundled():
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))["prompts"][0]
    r = run("-p", golden["text"], "--temp", "0", "-n", "8", "-t", "1")
    assert r.exit_code == 0, r.output
    from quantkit.formats.locate import bundled_model
    from quantkit.formats.gguf_io import GGUFModel
    from quantkit.model.tokenizer import Tokenizer

    with GGUFModel(bundled_model()) as g:
        tok = Tokenizer.from_metadata(g.metadata)
    assert r.stdout == golden["text"] + tok.decode(golden["greedy"][:8]) + "\n"
    assert "prompt eval time" in r.stderr and "eval time" in r.stderr and "load time" in r.stderr
    assert "decoded 8 tokens" in r.stderr


@pytest.mark.slow
def test_run_chat_and_prompt_file(tmp_path):
    """--chat with a prompt file prints the reply alone: the library's greedy continuation of the question
    wrapped in the model's chat template (render_chat; templates against llama.cpp's in tests/test_chat.py,
    greedy decoding against llama.cpp's in tests/test_model.py), decoded."""
    from quantkit.cli.run import DEFAULT_N_CTX
    from quantkit.model.chat import chat_template, render_chat
    from quantkit.model.sampling import Sampler, SamplerParams
    from quantkit.pipelines.generate import generate
    from quantkit.pipelines.loading import ctx_size, open_model

    question = "What is 2+2?"
    f = tmp_path / "prompt.txt"
    f.write_text(question, encoding="utf-8")
    r = run("-f", str(f), "--chat", "--temp", "0", "-n", "4", "-t", "1")
    assert r.exit_code == 0, r.output
    om = open_model()
    with om.model as model:
        tok = om.tok
        # SmolLM2's template starts with its BOS (<|im_start|>) and the model adds none of its own
        text = render_chat(chat_template(model.metadata), [{"role": "user", "content": question}], True,
                           tok.tokens[tok.bos_id], tok.tokens[tok.eos_id])
        assert text.startswith(tok.tokens[tok.bos_id]) and not tok.add_bos
        ids = tok.encode(text, add_special=False, parse_special=True)
        runner = om.runner(ctx_size(None, model.config.n_ctx_train, DEFAULT_N_CTX))
        reply = generate(runner, ids, 4, Sampler(SamplerParams(temp=0)), is_eog=tok.is_eog).tokens
    assert reply and r.stdout == tok.decode(reply) + "\n"


def test_help_lists_every_option():
    r = run("--help")
    assert r.exit_code == 0
    for opt in ("--model", "--prompt", "--file", "--n-predict", "--ctx-size", "--threads", "--temp", "--top-k",
                "--top-p", "--min-p", "--repeat-penalty", "--seed", "--chat", "--chat-template"):
        assert opt in r.output


@pytest.mark.parametrize("args, code, needle", [
    (["-p", "x", "--top-p", "1.5"], 2, "--top-p"),
    (["-p", "x", "--top-p", "0"], 2, "--top-p"),
    (["-p", "x", "--temp", "-1"], 2, "--temp"),
    (["-m", "/nonexistent/model.gguf", "-p", "x"], 2, "does not exist"),
    ([], 2, "no prompt"),
    (["-p", "x", "-f", "-"], 2, "not both"),
    (["-p", "x", "--chat-template", "gemma"], 2, "needs --chat"),
    (["-p", "x", "--chat", "--chat-template", "vicuna"], 2, "--chat-template"),
])
def test_usage_errors(args, code, needle):
    assert_one_line_error(run(*args), code, needle)


def test_context_over_trained_length():
    assert_one_line_error(run("-p", "hello", "-c", "100000", "-n", "1"), 1, "over the model's trained context length")


def test_prompt_longer_than_context():
    assert_one_line_error(run("-p", "one two three four five six seven eight nine ten", "-c", "4", "-n", "1"),
                          1, "too long for a context of 4")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    assert_one_line_error(run("-m", str(bad), "-p", "x"), 1, "not a GGUF file")


def test_greedy_output_same_for_1_and_2_threads():
    """`run --temp 0` prints the same text whatever the thread count (rows are split, never sums)."""
    outs = [run("-p", "Once upon a time", "--temp", "0", "-n", "24", "-t", t) for t in ("1", "2")]
    for r in outs:
        assert r.exit_code == 0, r.output
    assert outs[0].stdout == outs[1].stdout


@pytest.mark.parametrize("n", [1, 3, 10, 40])
def test_warm_up_leaves_a_clean_runner(tmp_path, n):
    """run's warm-up (a batch of the prompt's path, one decode step) leaves the cache cleared: the
    prompt's logits and the next steps after it equal a fresh Runner's, bit for bit."""
    import numpy as np

    from quantkit.model.forward import Runner
    from quantkit.model.llama import Llama
    from quantkit.pipelines.generate import warm_up
    from test_model import TOKENS, write_tiny

    ids = (TOKENS * 3)[:n]
    with Llama(write_tiny(tmp_path / "tiny.gguf")) as m:
        fresh, warmed = Runner(m, 64), Runner(m, 64)
        warm_up(warmed, ids)
        assert warmed.n_past == 0
        got = [[r.forward(ids, 0, logits="last")] + [r.forward([t], n + i) for i, t in enumerate(TOKENS[:3])]
               for r in (fresh, warmed)]
        for a, b in zip(*got):
            np.testing.assert_array_equal(a, b)
