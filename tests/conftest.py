"""Shared test helpers: an in-process CLI runner and the bundled model converted to F16 once."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings

# Commands' output is compared exactly; the first-compile notice (quantkit.jit.announce_compiles)
# has its own test.
os.environ["QUANTKIT_COMPILE_NOTICE"] = "0"

# Under pytest-xdist (`make test` runs two workers) the workers share one numba cache, the one every
# quantkit process uses (quantkit/cache.py): quantkit.jit makes them take turns at each kernel, so a
# kernel one worker compiled is loaded, not compiled again, by the other.

from quantkit.cli import main
from quantkit.formats.locate import bundled_model

# No test judges elapsed time (docs/DEVELOPING.md, "Tests"): Hypothesis's per-example deadline and its
# slow-data-generation health check are wall-clock thresholds a loaded machine can trip, so they are off
# for every property test (a test's own @settings may still say deadline=None; it cannot turn them on).
settings.register_profile("quantkit", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("quantkit")


#: the files that take longest on a cold cache (CPU seconds, nearly all compiling; tools/suite_profile.py),
#: longest first. `make test` hands whole files to two workers in collection order
#: (--no-loadscope-reorder): started first, the long ones end beside each other rather than one of them
#: running alone at the end while the other worker has nothing left.
LONGEST_FIRST = ("test_kernels.py", "test_decode.py", "test_optimize.py", "test_quantize.py", "test_convert.py",
                 "test_faults.py", "test_golden.py", "test_gemm.py", "test_mla.py", "test_lowbit_files.py",
                 "test_model.py", "test_target_bpw.py", "test_moe.py", "test_gemm_float.py", "test_cluster.py",
                 "test_readme_pipeline.py", "test_rowdots.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def hang_guard(seconds: float = 300):
    """Fail the test if the block is still running after ``seconds``: a guard against a hang only,
    generous enough that no working code on a loaded machine comes near it. It fails with pytest's
    ``Failed`` (a BaseException, so no command's error handling turns it into an error line)."""
    def hung(signum, frame):
        pytest.fail(f"still running after {seconds} s: a hang", pytrace=True)

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(args, cwd=None):
    """Invoke ``quantkit`` in-process (exceptions propagate), optionally from another directory."""
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def compare_imatrix(ours, ref) -> None:
    """quantkit's imatrix file ``ours`` against llama-imatrix's ``ref``: the same entries, chunk count and
    size, per entry the same counts and shape, the sums within 1e-3 on average (5e-2 at most) relative."""
    import numpy as np

    from quantkit.formats.imatrix import load_imatrix

    o, r = load_imatrix(ours), load_imatrix(ref)
    assert sorted(o.entries) == sorted(r.entries)
    assert (o.chunk_count, o.chunk_size) == (r.chunk_count, r.chunk_size)
    rel = []
    for name, e in r.entries.items():
        mine = o.entries[name]
        np.testing.assert_array_equal(mine.counts, e.counts, err_msg=name)
        assert mine.sums.shape == e.sums.shape, name
        rel.append((np.abs(mine.sums - e.sums) / np.maximum(np.abs(e.sums), 1e-30)).ravel())
    rel = np.concatenate(rel)
    assert rel.mean() < 1e-3 and rel.max() < 5e-2, (rel.mean(), rel.max())


def greedy_agreement(runner, prompt, want: list) -> int:
    """How many of llama.cpp's greedy tokens ``want`` a Runner (its cache empty) gives after ``prompt``,
    one token at a time, before the first one that differs (the golden files' greedy check)."""
    import numpy as np

    logits = runner.forward(prompt)[-1]
    for n, tok in enumerate(want):
        if int(np.argmax(logits)) != tok:
            return n
        logits = runner.forward([tok])[-1]
    return len(want)


def compare_to_reference(got, ref, variant: str) -> None:
    """A fast path's logits against the float64 reference's on a tiny model: the mean |difference| in units
    of the logits' spread, F16 0.5 % (measured 0.05-0.1 %), quantized 4 % (8-bit activations through 4
    layers: measured 1.5-2.6 %), and the same top token wherever the reference's top-2 gap is clear."""
    import numpy as np

    d = np.abs(got - ref)
    gap = np.diff(np.sort(ref, 1)[:, -2:], axis=1)[:, 0]
    clear = gap >= (0.1 if variant == "F16" else 1.5)
    print(f"{variant}: mean |d| {d.mean():.4f} max {d.max():.3f} (spread {ref.std(1).mean():.2f}), "
          f"top-1 {(got.argmax(1) == ref.argmax(1)).mean():.3f}, clear {clear.sum()}")
    assert d.mean() <= (0.005 if variant == "F16" else 0.04) * float(ref.std(1).mean())
    assert (got.argmax(1)[clear] == ref.argmax(1)[clear]).all()


def greedy_text(path, prompt: str, n: int) -> str:
    """The text of ``n`` greedy tokens after ``prompt`` from a Runner on the model at ``path``: what
    ``quantkit run --temp 0`` must print."""
    import numpy as np

    from quantkit.model.forward import Runner
    from quantkit.model.llama import Llama
    from quantkit.model.tokenizer import Tokenizer

    with Llama(path) as m:
        tok = Tokenizer.from_metadata(m.metadata)
        runner = Runner(m, 128)
        logits = runner.forward(tok.encode(prompt))[-1]
        out = []
        for _ in range(n):
            out.append(int(np.argmax(logits)))
            logits = runner.forward(out[-1:])[-1]
    return tok.decode(out)


@pytest.fixture(scope="session")
def smollm2_f16(tmp_path_factory) -> Path:
    """The bundled SmolLM2 (Q4_1) converted to F16 by `quantkit quantize`, once per test session.
    tests/test_quantize.py checks it byte for byte against llama-quantize's conversion."""
    out = tmp_path_factory.mktemp("smollm2") / "smollm2-f16.gguf"
    res = run_cli(["quantize", "-q", "--allow-requantize", bundled_model(), out, "F16", "2"])
    assert res.exit_code == 0, res.output
    return out
