"""`quantkit quantize` against the real llama-quantize's output on the bundled SmolLM2 model.

tests/data/quantize/golden.json holds, for each case, what libllama's llama_model_quantize wrote
(sha256 of the whole file, each tensor's type and a hash of its bytes, the metadata keys in order),
made by tools/make_quantize_golden.py. Here the same options go through our CLI and the files must be
identical byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import run_cli, sha256
from quantkit.formats.imatrix import Entry, Imatrix, load_imatrix, save_imatrix_dat, save_imatrix_gguf
from quantkit.formats.locate import bundled_model

DATA = Path(__file__).parent / "data" / "quantize"
GOLDEN = json.loads((DATA / "golden.json").read_text())
CASES = GOLDEN["cases"]
IMATRIX = "synthetic.imatrix.gguf"


def describe(path) -> dict:
    r = gguf.GGUFReader(path)
    return {
        "keys": [k for k in r.fields if not k.startswith("GGUF.")],
        "tensors": [[t.name, t.tensor_type.name, hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()[:16]]
                    for t in r.tensors],
    }


def explain_mismatch(path, case) -> str:
    ours = describe(path)
    lines = []
    if ours["keys"] != case["keys"]:
        lines.append(f"metadata keys differ:\n ours {ours['keys']}\n ref  {case['keys']}")
    ref = {t[0]: t for t in case["tensors"]}
    if [t[0] for t in ours["tensors"]] != [t[0] for t in case["tensors"]]:
        lines.append("tensor order differs")
    bad = [(t, ref.get(t[0])) for t in ours["tensors"] if ref.get(t[0]) != t]
    for t, r in bad[:8]:
        lines.append(f"tensor {t[0]}: ours {t[1]} {t[2]} vs llama.cpp {r and r[1]} {r and r[2]}")
    lines.append(f"{len(bad)} of {len(ours['tensors'])} tensors differ")
    return "\n".join(lines)


@pytest.fixture(scope="session")
def f16_model(smollm2_f16) -> Path:
    """SmolLM2 converted to F16 by our quantizer, checked against llama.cpp's F16 conversion."""
    assert sha256(smollm2_f16) == CASES["f16"]["sha256"], explain_mismatch(smollm2_f16, CASES["f16"])
    return smollm2_f16


def test_f16_matches_llama_cpp(f16_model):
    assert f16_model.exists()


QUANT_CASES = [name for name in CASES if name != "f16"]


@pytest.mark.parametrize("name", QUANT_CASES)
def test_quantize_matches_llama_quantize(name, f16_model, tmp_path):
    case = CASES[name]
    out = tmp_path / f"{name}.gguf"
    args = [IMATRIX if a == "IMATRIX" else a for a in case["args"]]
    threads = "1" if name == "q8_0" else "2"  # one case single-threaded: bytes must not depend on it
    # run from the imatrix's folder: its path is recorded in the output as given
    src = bundled_model() if case["source"] == "bundled" else f16_model
    res = run_cli(["quantize", "-q", *args, str(src), str(out), case["ftype"], threads], cwd=DATA)
    assert res.exit_code == 0, res.output
    assert sha256(out) == case["sha256"], explain_mismatch(out, case)


def test_tensor_type_file_equals_flags(f16_model, tmp_path):
    case = CASES["q4_k_m_tensor_type"]
    spec = tmp_path / "types.txt"
    spec.write_text("attn_v=q8_0\n" + r"\.(\d*[13579])\.ffn_down=q5_k" + "\n")
    out = tmp_path / "o.gguf"
    res = run_cli(["quantize", "-q", "--tensor-type-file", str(spec), str(f16_model), str(out), "Q4_K_M"])
    assert res.exit_code == 0, res.output
    assert sha256(out) == case["sha256"], explain_mismatch(out, case)


def test_legacy_dat_imatrix_gives_same_tensors(f16_model, tmp_path):
    """A .dat file whose values/ncall equal the GGUF file's sums/counts quantizes identically."""
    im = load_imatrix(DATA / IMATRIX)
    dat = tmp_path / "same.dat"
    blob = [struct.pack("<i", len(im.entries))]
    for name in sorted(im.entries):
        w = im.weights(name).reshape(-1).astype("<f4")
        nb = name.encode()
        blob.append(struct.pack("<i", len(nb)) + nb + struct.pack("<ii", 1, w.size) + w.tobytes())
    blob.append(struct.pack("<i", 10) + struct.pack("<i", 9) + b"synthetic")
    dat.write_bytes(b"".join(blob))
    out = tmp_path / "o.gguf"
    res = run_cli(["quantize", "-q", "--imatrix", str(dat), str(f16_model), str(out), "Q4_K_M"])
    assert res.exit_code == 0, res.output
    ours = describe(out)["tensors"]
    assert ours == CASES["q4_k_m_imatrix"]["tensors"]


def test_default_output_path_and_integer_ftype(f16_model, tmp_path):
    src = tmp_path / "in.gguf"
    os.link(f16_model, src) if hasattr(os, "link") else src.write_bytes(f16_model.read_bytes())
    res = run_cli(["quantize", "-q", str(src), "7"])  # 7 = Q8_0
    assert res.exit_code == 0, res.output
    out = tmp_path / "ggml-model-Q8_0.gguf"
    assert sha256(out) == CASES["q8_0"]["sha256"]


def test_dry_run_writes_nothing_and_plan_json(f16_model, tmp_path):
    plan = tmp_path / "plan.json"
    out = tmp_path / "never.gguf"
    res = run_cli(["quantize", "--dry-run", "--plan-out", str(plan), str(f16_model), str(out), "Q4_K_M"])
    assert res.exit_code == 0, res.output
    assert not out.exists()
    assert "quant size" in res.output and "(q6_K)" in res.output
    doc = json.loads(plan.read_text())
    ref = {t[0]: t[1] for t in CASES["q4_k_m"]["tensors"]}
    assert {t["name"]: t["type"] for t in doc["tensors"]} == ref
    assert doc["size_out"] + 0 > 0 and doc["n_fallback"] > 0


def test_fallback_summary_and_no_fallback(f16_model, tmp_path):
    out = tmp_path / "o.gguf"
    res = run_cli(["quantize", "--no-fallback", str(f16_model), str(out), "Q4_K_M"])
    assert res.exit_code == 1
    assert "--no-fallback" in res.output and "would fall back" in res.output
    assert "Traceback" not in res.output
    assert not out.exists() and not list(tmp_path.iterdir())
    res = run_cli(["quantize", "--dry-run", str(f16_model), "Q4_K_M"])
    assert "required fallback quantization" in res.output and "BPW over the intended types" in res.output


def one_line_error(res, code=1):
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("Error:"), res.output
    return lines[-1]


def test_requantize_refused_without_flag(tmp_path):
    out = tmp_path / "o.gguf"
    msg = one_line_error(run_cli(["quantize", str(bundled_model()), str(out), "Q4_K_M"]))
    assert "requantizing from type q4_1 is disabled" in msg
    assert not out.exists() and not list(tmp_path.iterdir())


def test_bad_inputs_one_line(tmp_path, f16_model):
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"hello world" * 10)
    assert "not a GGUF" in one_line_error(run_cli(["quantize", str(notgguf), str(tmp_path / "o.gguf"), "Q8_0"]))
    trunc = tmp_path / "t.gguf"
    with open(f16_model, "rb") as f:
        trunc.write_bytes(f.read(3_000_000))
    msg = one_line_error(run_cli(["quantize", str(trunc), str(tmp_path / "o.gguf"), "Q8_0"]))
    assert str(trunc) in msg
    missing = one_line_error(run_cli(["quantize", str(tmp_path / "nope.gguf"), str(tmp_path / "o.gguf"), "Q8_0"]))
    assert "no such file" in missing
    nodir = one_line_error(run_cli(["quantize", str(f16_model), str(tmp_path / "no" / "o.gguf"), "Q8_0"]))
    assert "does not exist" in nodir
    same = one_line_error(run_cli(["quantize", str(f16_model), str(f16_model), "Q8_0"]))
    assert "same file" in same
    badim = tmp_path / "bad.imatrix"
    badim.write_bytes(struct.pack("<i", 1000000))
    msg = one_line_error(run_cli(["quantize", "--imatrix", str(badim), str(f16_model), str(tmp_path / "o.gguf"), "Q4_K_M"]))
    assert "imatrix" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.imatrix", "t.gguf", "x.gguf"]


@pytest.mark.parametrize("args,needle", [
    (["Q9_X"], "Q9_X"),
    (["--tensor-type", "attn_v", "Q4_K_M"], "PATTERN=TYPE"),
    (["--tensor-type", "attn_v=q9", "Q4_K_M"], "q9"),
    (["--tensor-type", "(unclosed=q8_0", "Q4_K_M"], "unclosed"),
    (["--override-kv", "general.name:broken", "Q4_K_M"], "KEY=TYPE:VALUE"),
    (["--override-kv", "a=int:x", "Q4_K_M"], "int"),
    (["--output-tensor-type", "q7_k", "Q4_K_M"], "q7_k"),
    (["--include-weights", "a", "--exclude-weights", "b", "Q4_K_M"], "cannot be used together"),
])
def test_usage_errors_exit_2(args, needle, f16_model, tmp_path):
    *opts, ftype = args
    res = run_cli(["quantize", *opts, str(f16_model), str(tmp_path / "o.gguf"), ftype])
    assert res.exit_code == 2, res.output
    assert needle.lower() in res.output.lower()
    assert "Traceback" not in res.output
    assert not (tmp_path / "o.gguf").exists()


def test_imatrix_size_mismatch_is_fatal(f16_model, tmp_path):
    im = Imatrix({"blk.0.attn_q.weight": Entry(np.ones((1, 100), np.float32), np.ones(1, np.float32))},
                 ["x"], 1, 512)
    p = save_imatrix_gguf(im, tmp_path / "small.gguf")
    out = tmp_path / "o.gguf"
    msg = one_line_error(run_cli(["quantize", "--imatrix", str(p), str(f16_model), str(out), "Q4_K_M"]))
    assert "imatrix size 100 is different from tensor size 576 for blk.0.attn_q.weight" in msg
    assert not out.exists()


def test_imatrix_nonfinite_refused(f16_model, tmp_path):
    im = Imatrix({"blk.0.attn_q.weight": Entry(np.full((1, 576), np.nan, np.float32), np.ones(1, np.float32))},
                 ["x"], 1, 512)
    p = save_imatrix_gguf(im, tmp_path / "nan.gguf")
    msg = one_line_error(run_cli(["quantize", "--imatrix", str(p), str(f16_model), str(tmp_path / "o.gguf"), "Q4_K_M"]))
    assert "non-finite" in msg


def test_imatrix_formats_roundtrip(tmp_path):
    im = load_imatrix(DATA / IMATRIX)
    assert im.chunk_count == 10 and im.chunk_size == 512 and im.datasets == ["synthetic"]
    g = save_imatrix_gguf(im, tmp_path / "copy.gguf")
    again = load_imatrix(g)
    for k, e in im.entries.items():
        assert np.array_equal(again.entries[k].sums, e.sums) and np.array_equal(again.entries[k].counts, e.counts)
    d, stored = save_imatrix_dat(im, tmp_path / "copy.dat")
    assert stored == len(im.entries)
    legacy = load_imatrix(d)
    assert legacy.legacy and legacy.datasets == ["synthetic"] and legacy.chunk_count == 10
    for k in im.entries:
        np.testing.assert_allclose(legacy.weights(k), im.weights(k), rtol=2e-7)


def test_legacy_dat_weight_rules(tmp_path):
    """value / ncall, and the raw value when ncall is 0 (reference imatrix.md §3.5)."""
    vals = np.array([3.0, 6.0, 0.0, 1.5], dtype="<f4")
    blob = struct.pack("<i", 2)
    for name, ncall in (("a.weight", 3), ("b.weight", 0)):
        blob += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, 4) + vals.tobytes()
    p = tmp_path / "x.dat"
    p.write_bytes(blob)  # no trailer: it is optional
    im = load_imatrix(p)
    np.testing.assert_array_equal(im.weights("a.weight")[0], vals / np.float32(3))
    np.testing.assert_array_equal(im.weights("b.weight")[0], vals)
    p.write_bytes(blob[:-3])
    with pytest.raises(Exception) as e:
        load_imatrix(p)
    assert "truncated" in str(e.value) or "beyond" in str(e.value)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_quantize_leaves_no_output(sig, f16_model, tmp_path):
    """Signalled while provably mid-write (paused after its third tensor, tests/faults.py): nothing at
    the output, the input untouched; a clean stop quantizes no further tensor and leaves no temporary file."""
    from faults import Job

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "o.gguf"
    before = os.stat(f16_model)
    job = Job(["quantize", "-q", f16_model, out, "Q4_K_M"], tmp_path / "ctl", pause=("quantize.tensor", 3))
    job.wait_paused()
    assert list(out_dir.glob(".o.gguf.*.partial")), "no temporary file while paused mid-write"
    job.signal(sig)
    assert not out.exists()
    after = os.stat(f16_model)  # the input is read through a read-only map: never modified
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    left = [p.name for p in out_dir.iterdir()]
    if sig != signal.SIGKILL:  # a clean stop removes its temporary file
        assert left == [], left
        assert job.proc.returncode == 128 + sig and job.passes_after_pause() == [], (job.proc.returncode, job.err)
        assert job.err.strip().splitlines()[-1].startswith("interrupted") and "Traceback" not in job.err
    else:  # nothing can run on SIGKILL; the temporary file is hidden and never at the output path
        assert len(left) == 1 and left[0].startswith(".o.gguf.") and left[0].endswith(".partial"), left


_RSS_SCRIPT = r"""
import resource, sys
import numpy as np
from quantkit.formats.gguf_io import GGUFModel
from quantkit.pipelines.quantize import QuantizeOptions, plan_quantization, quantize_file
import quantkit.quants as q
mode, src, dst = sys.argv[1:4]
opts = QuantizeOptions(ftype="F16", threads=2, allow_requantize=True)
# warm the kernels the job uses, so both runs load the same compiled code
q.dequantize(np.zeros((1, 612), np.uint8), "Q8_0"); q.dequantize(np.zeros((1, 20), np.uint8), "Q4_1")
q.quantize(np.ones((1, 576), np.float32), "F16"); q.dequantize(np.zeros((1, 2), np.uint8), "F16")
if mode == "plan":
    m = GGUFModel(src)
    plan_quantization(m, opts)
else:
    quantize_file(src, dst, opts)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def test_quantize_peak_memory_is_about_one_tensor(tmp_path):
    """Peak RSS of a whole quantization stays within 2x the largest output tensor above the RSS of just
    opening and planning it: no float32 copy of a tensor is made (slabs of rows go through a small reused
    buffer) and source pages are released as they are used."""
    src = str(bundled_model())

    def peak(mode):
        out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, mode, src, str(tmp_path / "o.gguf")],
                             capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1])

    base = peak("plan")
    full = peak("quantize")
    largest_out = 576 * 49152 * 2  # token_embd.weight in F16 (its float32 copy would be twice that)
    assert full - base <= 2 * largest_out, (full - base) / 2**20


def _one_tensor_llama(path: Path, w: np.ndarray) -> Path:
    """A minimal llama GGUF holding one F32 blk.0.attn_q.weight of shape (256, 64)."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFValueType

    from quantkit.formats.gguf_io import KV, GGUFOutput, Tensor

    kv = [KV("general.architecture", "llama", GGUFValueType.STRING),
          KV("llama.block_count", 1, GGUFValueType.UINT32),
          KV("llama.context_length", 64, GGUFValueType.UINT32),
          KV("llama.embedding_length", 256, GGUFValueType.UINT32),
          KV("llama.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32),
          KV("llama.attention.head_count", 4, GGUFValueType.UINT32)]
    with GGUFOutput(path, kv, [Tensor("blk.0.attn_q.weight", (256, 64), T.F32)]) as out:
        out.write("blk.0.attn_q.weight", w)
        out.commit()
    return path


def test_nonfinite_source_refused_before_writing(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    w[5, 7] = np.nan
    w[9, 1] = np.inf
    src = _one_tensor_llama(tmp_path / "nan.gguf", w)
    dst = tmp_path / "o.gguf"
    msg = one_line_error(run_cli(["quantize", str(src), str(dst), "Q8_0"]))
    assert "blk.0.attn_q.weight contains 2 NaN/Inf" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.gguf"]


def test_scale_overflow_refused_and_nothing_left(tmp_path):
    """Finite weights too large for Q8_0's fp16 scale: llama-quantize's ggml_validate_row_data refuses the
    tensor ("quantized data validation failed"); so do we, and the output is never created."""
    w = np.random.default_rng(4).standard_normal((64, 256)).astype(np.float32)
    w[40, 3] = 1e9  # amax / 127 is beyond fp16's 65504: that block's d is Inf
    src = _one_tensor_llama(tmp_path / "big.gguf", w)
    msg = one_line_error(run_cli(["quantize", str(src), str(tmp_path / "o.gguf"), "Q8_0"]))
    assert "blk.0.attn_q.weight: quantized data validation failed" in msg and "1 block(s)" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.gguf"]


def test_type_without_a_codec_refused_before_any_work(tmp_path, f16_model):
    """A file type whose rules name a type quantkit has no codec for (here Q4_K, taken out of the registry
    for the test): one line, before the first output byte."""
    from gguf import GGMLQuantizationType as T

    import quantkit.quants as Q

    # the registry back as it was and in its order (monkeypatch.delitem would put Q4_K back at the end)
    saved = dict(Q.TRAITS)
    del Q.TRAITS[T.Q4_K]
    out = tmp_path / "o.gguf"
    try:
        msg = one_line_error(run_cli(["quantize", str(f16_model), str(out), "Q4_K_M"]))
    finally:
        Q.TRAITS.clear()
        Q.TRAITS.update(saved)
    assert "quantizing to Q4_K is not implemented yet in quantkit (no codec)" in msg
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("ftype", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "Q2_K_S"])
def test_low_bit_file_types_need_an_imatrix(ftype, tmp_path, f16_model):
    """llama-quantize refuses these without an importance matrix (tensor_requires_imatrix); so does quantkit,
    in one line and before any work -- whether or not the codecs exist yet."""
    out = tmp_path / "o.gguf"
    msg = one_line_error(run_cli(["quantize", str(f16_model), str(out), ftype]))
    assert "requires an importance matrix" in msg
    assert not out.exists()


def test_q2_0_refused_in_one_line(tmp_path, f16_model):
    res = run_cli(["quantize", str(f16_model), str(tmp_path / "o.gguf"), "Q2_0"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "Q2_0 is not supported by quantkit: gguf-py 0.19.0" in res.output
