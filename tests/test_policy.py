"""Per-tensor type selection (quantkit.policy) against llama.cpp.

Two kinds of expectations:

* golden tables measured from the real llama.cpp (tests/data/policy/*.json, made by
  tools/make_policy_golden.py; see tests/data/policy/README.md);
* tables for real models' shapes written from llama_tensor_get_type's rules (restated here
  independently of the implementation, as small per-category functions).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings
from hypothesis import strategies as st

from quantkit.errors import PolicyError, QuantkitError
from quantkit.policy import NoFallbackError, choose_types, is_70b, plan_types, use_more_bits
from quantkit.typenames import FILE_TYPES, ggml_type_name, parse_ftype, parse_ggml_type, parse_tensor_type_arg

GOLDEN_DIR = Path(__file__).parent / "data" / "policy"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))


# ---------------------------------------------------------------------------------------------
# Golden tables from llama.cpp
# ---------------------------------------------------------------------------------------------


def _golden_cases():
    for path in GOLDEN_FILES:
        doc = json.loads(path.read_text())
        for i, case in enumerate(doc["cases"]):
            yield pytest.param(doc, case, id=f"{doc['model']}-{i}-{case['ftype']}-{json.dumps(case['options'])}")


def _kwargs(opts: dict) -> dict:
    return dict(
        pure=opts.get("pure", False),
        has_imatrix=opts.get("imatrix", False),
        output_tensor_type=opts.get("output_tensor_type"),
        token_embedding_type=opts.get("token_embedding_type"),
        tensor_types=[tuple(x) for x in opts.get("tensor_types", [])],
        leave_output_tensor=opts.get("leave_output_tensor", False),
    )


def test_golden_files_present():
    names = {p.stem for p in GOLDEN_FILES}
    assert {"llama28_gqa2", "llama40_gqa5", "llama80_70b", "moe8", "tied16", "smollm2_135m", "odd100", "llama512",
            "llama576"} <= names


@pytest.mark.parametrize("doc,case", list(_golden_cases()))
def test_matches_llama_cpp(doc, case):
    tensors = [(name, shape, Q.F32 if len(shape) == 1 else Q.F16) for name, shape in doc["tensors"]]
    kwargs = _kwargs(case["options"])
    error = case.get("error")
    if error and "fallback" in error:
        with pytest.raises(NoFallbackError, match=re.escape(error.split()[-1])):
            plan_types(doc["metadata"], tensors, case["ftype"], **kwargs)
        return
    plan = plan_types(doc["metadata"], tensors, case["ftype"], **kwargs)
    if error:  # llama.cpp refuses to run without an imatrix
        assert "imatrix" in error
        assert not kwargs["has_imatrix"] and plan.imatrix_required_by
        return
    got = plan.types()
    expected = {name: parse_ggml_type(t) for (name, _), t in zip(doc["tensors"], case["types"])}
    diff = {n: (ggml_type_name(got[n]), ggml_type_name(t)) for n, t in expected.items() if got[n] != t}
    assert not diff, f"(quantkit, llama.cpp): {diff}"
    assert plan.n_fallback == case["n_fallback"]
    # llama.cpp prints the override notice only when the pattern's type differs from the default
    assert sorted(name for name, _, _ in plan.override_notices()) == case["manual"]
    if not kwargs["has_imatrix"]:
        assert not plan.imatrix_required_by  # llama.cpp ran, so nothing needed one


# ---------------------------------------------------------------------------------------------
# Real models' shapes, expectations from llama_tensor_get_type's rules
# ---------------------------------------------------------------------------------------------


def llama(n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab=32000, *, tied=False, n_expert=0, arch="llama",
          head_kv_dim=128):
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": n_layer,
        f"{arch}.embedding_length": n_embd,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
    }
    if n_expert:
        meta[f"{arch}.expert_count"] = n_expert
    n_kv = n_head_kv * head_kv_dim
    tensors = [("token_embd.weight", (n_embd, n_vocab), Q.F16), ("output_norm.weight", (n_embd,), Q.F32),
               ("rope_freqs.weight", (64,), Q.F32)]
    if not tied:
        tensors.append(("output.weight", (n_embd, n_vocab), Q.F16))
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", (n_embd,), Q.F32),
            (p + "attn_q.weight", (n_embd, n_embd), Q.F16),
            (p + "attn_k.weight", (n_embd, n_kv), Q.F16),
            (p + "attn_v.weight", (n_embd, n_kv), Q.F16),
            (p + "attn_output.weight", (n_embd, n_embd), Q.F16),
            (p + "ffn_norm.weight", (n_embd,), Q.F32),
        ]
        if n_expert:
            tensors += [
                (p + "ffn_gate_inp.weight", (n_embd, n_expert), Q.F32),
                (p + "ffn_gate_exps.weight", (n_embd, n_ff, n_expert), Q.F16),
                (p + "ffn_up_exps.weight", (n_embd, n_ff, n_expert), Q.F16),
                (p + "ffn_down_exps.weight", (n_ff, n_embd, n_expert), Q.F16),
            ]
        else:
            tensors += [
                (p + "ffn_gate.weight", (n_embd, n_ff), Q.F16),
                (p + "ffn_up.weight", (n_embd, n_ff), Q.F16),
                (p + "ffn_down.weight", (n_ff, n_embd), Q.F16),
            ]
    return meta, tensors


LLAMA28 = llama(28, 3072, 8192, 16, 8, 128256)  # GQA 2
LLAMA40 = llama(40, 5120, 13824, 40, 8)  # GQA 5
LLAMA70B = llama(80, 8192, 28672, 64, 8, 128256)  # GQA 8, "70B"
MIXTRAL = llama(32, 4096, 14336, 32, 8, n_expert=8)
TIED = llama(16, 2048, 8192, 32, 8, 128256, tied=True)  # Llama-3.2-1B-like
SMOLLM2 = llama(30, 576, 1536, 9, 3, 49152, tied=True, head_kv_dim=64)  # SmolLM2-135M


def layer(name):
    return int(name.split(".")[1])


def by(types, suffix):
    """The types of every 'blk.N.<suffix>' tensor, in layer order."""
    items = sorted((layer(n), t) for n, t in types.items() if n.startswith("blk.") and n.endswith(suffix))
    return [t for _, t in items]


# llama_tensor_get_type's result for a dense llama model, restated per column:
# ftype -> (D, attn_v(i, n), attn_output, ffn_down(i, n))
def _dense_rules(n_gqa):
    umb = use_more_bits
    return {
        "Q2_K": (Q.Q2_K, lambda i, n: Q.Q4_K if n_gqa >= 4 else Q.Q3_K, Q.Q3_K, lambda i, n: Q.Q3_K),
        "Q3_K_S": (Q.Q3_K, lambda i, n: Q.Q3_K, Q.Q3_K, lambda i, n: Q.Q3_K),
        "Q3_K_M": (Q.Q3_K, lambda i, n: Q.Q5_K if i < 2 else Q.Q4_K, Q.Q4_K,
                   lambda i, n: Q.Q5_K if i < n // 16 else Q.Q4_K),
        "Q3_K_L": (Q.Q3_K, lambda i, n: Q.Q5_K, Q.Q5_K, lambda i, n: Q.Q5_K),
        "Q4_K_S": (Q.Q4_K, lambda i, n: Q.Q5_K if i < 4 else Q.Q4_K, Q.Q4_K,
                   lambda i, n: Q.Q5_K if i < n // 8 else Q.Q4_K),
        "Q4_K_M": (Q.Q4_K, lambda i, n: Q.Q6_K if umb(i, n) else Q.Q4_K, Q.Q4_K,
                   lambda i, n: Q.Q6_K if umb(i, n) else Q.Q4_K),
        "Q5_K_S": (Q.Q5_K, lambda i, n: Q.Q5_K, Q.Q5_K, lambda i, n: Q.Q5_K),
        "Q5_K_M": (Q.Q5_K, lambda i, n: Q.Q6_K if umb(i, n) else Q.Q5_K, Q.Q5_K,
                   lambda i, n: Q.Q6_K if umb(i, n) else Q.Q5_K),
        "Q6_K": (Q.Q6_K, lambda i, n: Q.Q6_K, Q.Q6_K, lambda i, n: Q.Q6_K),
        "Q4_0": (Q.Q4_0, lambda i, n: Q.Q4_0, Q.Q4_0, lambda i, n: Q.Q4_0),
        "Q4_1": (Q.Q4_1, lambda i, n: Q.Q4_1, Q.Q4_1, lambda i, n: Q.Q4_1),
        "Q5_0": (Q.Q5_0, lambda i, n: Q.Q5_0, Q.Q5_0, lambda i, n: Q.Q5_0),
        "Q5_1": (Q.Q5_1, lambda i, n: Q.Q5_1, Q.Q5_1, lambda i, n: Q.Q5_1),
        "Q8_0": (Q.Q8_0, lambda i, n: Q.Q8_0, Q.Q8_0, lambda i, n: Q.Q8_0),
    }


@pytest.mark.parametrize("model", ["llama28", "llama40"])
@pytest.mark.parametrize("ftype", list(_dense_rules(0)))
def test_dense_llama_table(model, ftype):
    meta, tensors = {"llama28": LLAMA28, "llama40": LLAMA40}[model]
    n_layer = meta["llama.block_count"]
    n_gqa = meta["llama.attention.head_count"] // meta["llama.attention.head_count_kv"]
    d, attn_v, attn_out, ffn_down = _dense_rules(n_gqa)[ftype]
    types = choose_types(meta, tensors, ftype)
    assert types["output.weight"] == (Q.Q8_0 if ftype == "Q8_0" else Q.Q6_K)
    assert types["token_embd.weight"] == d
    assert by(types, "attn_v.weight") == [attn_v(i, n_layer) for i in range(n_layer)]
    assert by(types, "attn_output.weight") == [attn_out] * n_layer
    assert by(types, "ffn_down.weight") == [ffn_down(i, n_layer) for i in range(n_layer)]
    for suffix in ("attn_q.weight", "attn_k.weight", "ffn_gate.weight", "ffn_up.weight"):
        assert by(types, suffix) == [d] * n_layer
    for name, _, source in tensors:
        if "norm" in name or "rope" in name:
            assert types[name] == source


def test_gqa5_specific_rows():
    meta, tensors = LLAMA40
    assert set(by(choose_types(meta, tensors, "Q2_K"), "attn_v.weight")) == {Q.Q4_K}
    assert set(by(choose_types(meta, tensors, "IQ4_NL"), "attn_v.weight")) == {Q.Q5_K}
    assert set(by(choose_types(meta, tensors, "Q2_K_S", has_imatrix=True), "attn_v.weight")) == {Q.Q4_K}
    # GQA 2: no bump
    assert set(by(choose_types(*LLAMA28[:1], LLAMA28[1], "IQ4_NL"), "attn_v.weight")) == {Q.IQ4_NL}


@pytest.mark.parametrize("has_imatrix", [False, True])
@pytest.mark.parametrize("ftype,low,high", [("Q4_0", Q.Q4_0, Q.Q4_1), ("Q5_0", Q.Q5_0, Q.Q5_1)])
def test_legacy_ffn_down_with_imatrix(ftype, low, high, has_imatrix):
    meta, tensors = LLAMA28
    down = by(choose_types(meta, tensors, ftype, has_imatrix=has_imatrix), "ffn_down.weight")
    expect = [high if has_imatrix and i < 28 // 8 else low for i in range(28)]
    assert down == expect


def test_iq4_ffn_down_without_imatrix():
    meta, tensors = LLAMA28
    for ftype, d in (("IQ4_NL", Q.IQ4_NL), ("IQ4_XS", Q.IQ4_XS)):
        assert by(choose_types(meta, tensors, ftype), "ffn_down.weight") == [Q.Q5_K] * 3 + [d] * 25
        assert by(choose_types(meta, tensors, ftype, has_imatrix=True), "ffn_down.weight") == [d] * 28


def test_70b_bumps_attn_v():
    meta, tensors = LLAMA70B
    for ftype in ("Q2_K", "Q3_K_S", "Q4_K_S", "Q3_K_M"):
        assert set(by(choose_types(meta, tensors, ftype), "attn_v.weight")) == {Q.Q5_K}, ftype
    v = by(choose_types(meta, tensors, "Q4_K_M"), "attn_v.weight")
    assert v == [Q.Q6_K if use_more_bits(i, 80) else Q.Q5_K for i in range(80)]
    # ffn_down is not affected by the 70B rule
    assert by(choose_types(meta, tensors, "Q3_K_M"), "ffn_down.weight") == [Q.Q5_K] * 5 + [Q.Q4_K] * 75
    # 80 layers without GQA is the 65B type
    meta_mha = dict(meta, **{"llama.attention.head_count_kv": 64})
    assert set(by(choose_types(meta_mha, tensors, "Q3_K_S"), "attn_v.weight")) == {Q.Q3_K}


def test_is_70b():
    assert is_70b("llama", 80, 64, 8, 0)
    assert not is_70b("llama", 80, 64, 64, 0)
    assert not is_70b("llama", 80, 64, 8, 8)
    assert not is_70b("llama", 79, 64, 8, 0)
    assert is_70b("qwen2", 80, 64, 64, 0) and is_70b("olmo", 80, 1, 1, 0) and is_70b("deci", 80, 1, 1, 0)
    assert is_70b("jais2", 68, 1, 1, 0) and not is_70b("jais2", 80, 1, 1, 0)
    assert not is_70b("gemma", 80, 64, 8, 0)


def test_use_more_bits_examples():
    def layers(n):
        return [i for i in range(n) if use_more_bits(i, n)]

    assert layers(32) == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert layers(28) == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    assert layers(80) == list(range(10)) + list(range(12, 70, 3)) + list(range(70, 80))


@pytest.mark.parametrize("ftype", ["Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "Q4_0", "Q8_0"])
def test_eight_experts(ftype):
    meta, tensors = MIXTRAL
    types = choose_types(meta, tensors, ftype)
    d = parse_ftype(ftype).default
    assert set(by(types, "attn_v.weight")) == {Q.Q8_0}
    assert set(by(types, "attn_k.weight")) == {Q.Q8_0}
    bumped = ftype in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M")
    assert set(by(types, "attn_output.weight")) == {Q.Q5_K if bumped else d}
    assert set(by(types, "ffn_gate_inp.weight")) == {Q.F32}  # the router is never quantized
    assert set(by(types, "ffn_gate_exps.weight")) == {d}
    if ftype == "Q4_K_M":
        assert by(types, "ffn_down_exps.weight") == [Q.Q6_K if use_more_bits(i, 32) else Q.Q4_K for i in range(32)]


def test_moe_ffn_layer_comes_from_the_name():
    meta, tensors = MIXTRAL
    # a --tensor-type override on layer 0 does not shift the other layers: the layer is parsed
    types = choose_types(meta, tensors, "Q4_K_M", tensor_types=[(r"blk\.0\.ffn_down", "q8_0")])
    down = by(types, "ffn_down_exps.weight")
    assert down[0] == Q.Q8_0
    assert down[1:] == [Q.Q6_K if use_more_bits(i, 32) else Q.Q4_K for i in range(1, 32)]
    with pytest.raises(PolicyError, match="layer"):
        choose_types(meta, tensors + [("mtp.ffn_down_exps.weight", (14336, 4096, 8), Q.F16)], "Q4_K_M")
    with pytest.raises(PolicyError, match=r"bad layer 32 .*\[0, 32\)"):
        choose_types(meta, tensors + [("blk.32.ffn_up_exps.weight", (4096, 14336, 8), Q.F16)], "Q4_K_M")


def test_tied_embeddings():
    meta, tensors = TIED
    assert "output.weight" not in {n for n, _, _ in tensors}
    assert choose_types(meta, tensors, "Q4_K_M")["token_embd.weight"] == Q.Q6_K
    assert choose_types(meta, tensors, "Q2_K")["token_embd.weight"] == Q.Q6_K
    assert choose_types(meta, tensors, "Q8_0")["token_embd.weight"] == Q.Q8_0
    # the output override reaches a tied token_embd through the mixture rules ...
    assert choose_types(meta, tensors, "Q4_K_M", output_tensor_type="q5_k")["token_embd.weight"] == Q.Q5_K
    # ... which --pure skips
    assert choose_types(meta, tensors, "Q4_K_M", pure=True, output_tensor_type="q8_0")["token_embd.weight"] == Q.Q4_K
    assert choose_types(meta, tensors, "Q4_K_M", token_embedding_type="q4_0")["token_embd.weight"] == Q.Q4_0


def test_smollm2_135m_q4_k_m():
    meta, tensors = SMOLLM2
    plan = plan_types(meta, tensors, "Q4_K_M")
    types = plan.types()
    # 576 columns: q4_K -> q5_0, q6_K -> q8_0; ffn_down has 1536 columns and needs no fallback
    assert types["token_embd.weight"] == Q.Q8_0  # tied; 576 % 256 != 0 -> q8_0 by rule A, no fallback
    assert by(types, "attn_q.weight") == [Q.Q5_0] * 30
    assert by(types, "attn_v.weight") == [Q.Q8_0 if use_more_bits(i, 30) else Q.Q5_0 for i in range(30)]
    assert by(types, "ffn_down.weight") == [Q.Q6_K if use_more_bits(i, 30) else Q.Q4_K for i in range(30)]
    assert by(types, "ffn_gate.weight") == [Q.Q5_0] * 30
    assert plan.n_fallback == 30 * 6
    rec = {t.name: t for t in plan.tensors}
    assert rec["blk.0.attn_v.weight"].fallback_from == Q.Q6_K
    assert rec["blk.1.attn_q.weight"].fallback_from == Q.Q4_K
    assert rec["blk.1.ffn_down.weight"].fallback_from is None
    assert not rec["blk.1.ffn_norm.weight"].quantizable


def test_smollm2_135m_other_ftypes():
    meta, tensors = SMOLLM2
    q40 = plan_types(meta, tensors, "Q4_0")
    assert q40.types()["token_embd.weight"] == Q.Q8_0 and q40.n_fallback == 1  # q6_K -> q8_0
    assert set(by(q40.types(), "ffn_down.weight")) == {Q.Q4_0}
    q2 = choose_types(meta, tensors, "Q2_K")
    assert set(by(q2, "attn_q.weight")) == {Q.Q4_0}  # q2_K -> q4_0
    assert set(by(q2, "attn_v.weight")) == {Q.Q4_0}  # q3_K (GQA 3) -> q4_0
    assert set(by(q2, "ffn_down.weight")) == {Q.Q3_K}  # 1536 columns
    q3m = choose_types(meta, tensors, "Q3_K_M")
    assert by(q3m, "attn_v.weight") == [Q.Q5_1] * 2 + [Q.Q5_0] * 28
    assert by(q3m, "ffn_down.weight") == [Q.Q5_K] + [Q.Q4_K] * 29
    assert set(choose_types(meta, tensors, "Q8_0").values()) == {Q.Q8_0, Q.F32}
    pure = plan_types(meta, tensors, "Q6_K", pure=True)
    assert pure.n_fallback == 30 * 6 + 1
    assert pure.types()["token_embd.weight"] == Q.Q8_0


def test_q6_k_and_q8_0_everywhere():
    meta, tensors = LLAMA28
    for ftype, d in (("Q6_K", Q.Q6_K), ("Q8_0", Q.Q8_0)):
        types = choose_types(meta, tensors, ftype)
        assert {types[n] for n, s, _ in tensors if len(s) == 2} == {d}


def test_pure():
    meta, tensors = LLAMA28
    types = choose_types(meta, tensors, "Q4_K_M", pure=True)
    assert {types[n] for n, s, _ in tensors if len(s) == 2} == {Q.Q4_K}
    # pure with a pattern: the pattern still applies
    types = choose_types(meta, tensors, "Q2_K", pure=True, tensor_types=[("attn_output", "q8_0")])
    assert set(by(types, "attn_output.weight")) == {Q.Q8_0}
    assert types["output.weight"] == Q.Q2_K


def test_tensor_type_overrides_shift_counters():
    meta, tensors = LLAMA28
    plain = by(choose_types(meta, tensors, "Q3_K_M"), "attn_v.weight")
    assert plain[:4] == [Q.Q5_K, Q.Q5_K, Q.Q4_K, Q.Q4_K]
    plan = plan_types(meta, tensors, "Q3_K_M", tensor_types=[(r"blk\.0\.attn_v", "q8_0")])
    shifted = by(plan.types(), "attn_v.weight")
    # blk.0 is manual and does not advance i_attention_wv, so blk.1 and blk.2 are "the first two"
    assert shifted[:4] == [Q.Q8_0, Q.Q5_K, Q.Q5_K, Q.Q4_K]
    assert [t.name for t in plan.manual] == ["blk.0.attn_v.weight"]
    # ffn_down with Q4_K_M: a manual layer 0 shifts use_more_bits by one for every later layer
    down = by(choose_types(meta, tensors, "Q4_K_M", tensor_types=[(r"blk\.0\.ffn_down", "q8_0")]),
              "ffn_down.weight")
    assert down == [Q.Q8_0] + [Q.Q6_K if use_more_bits(i - 1, 28) else Q.Q4_K for i in range(1, 28)]
    # a match equal to the default still counts as manual (llama.cpp #22572)
    down = by(choose_types(meta, tensors, "Q4_K_M", tensor_types=[(r"blk\.[0-3]\.ffn_down", "q4_k")]),
              "ffn_down.weight")
    assert down == [Q.Q4_K] * 4 + [Q.Q6_K if use_more_bits(i - 4, 28) else Q.Q4_K for i in range(4, 28)]


def test_first_matching_pattern_wins():
    meta, tensors = LLAMA28
    types = choose_types(meta, tensors, "Q4_K_M", tensor_types=[("attn_v", "q5_k"), (r"blk\.1\.attn_v", "q8_0")])
    assert set(by(types, "attn_v.weight")) == {Q.Q5_K}


def test_output_and_token_embedding_types():
    meta, tensors = LLAMA28
    types = choose_types(meta, tensors, "Q4_K_M", output_tensor_type="q8_0", token_embedding_type="Q5_0")
    assert types["output.weight"] == Q.Q8_0 and types["token_embd.weight"] == Q.Q5_0
    # no fallback for the explicit types
    meta_s, tensors_s = SMOLLM2
    assert choose_types(meta_s, tensors_s, "Q4_K_M", token_embedding_type="q4_k")["token_embd.weight"] == Q.Q4_K


def test_leave_output_tensor():
    meta, tensors = LLAMA28
    plan = plan_types(meta, tensors, "Q3_K_M", leave_output_tensor=True, output_tensor_type="q8_0")
    rec = {t.name: t for t in plan.tensors}
    assert rec["output.weight"].target == Q.F16 and not rec["output.weight"].quantizable
    assert rec["token_embd.weight"].target == Q.Q3_K  # not tied: output.weight exists


def test_float_ftypes_and_copy():
    meta, tensors = LLAMA28
    f32_src = [(n, s, Q.F32) for n, s, _ in tensors]
    for ftype, d in (("F16", Q.F16), ("BF16", Q.BF16), ("f32", Q.F32)):
        types = choose_types(meta, f32_src, ftype, pure=True, tensor_types=[("attn", "q8_0")])
        assert {types[n] for n, s, _ in tensors if len(s) == 2} == {d}
        assert types["output_norm.weight"] == Q.F32
    assert choose_types(meta, f32_src, "F16", output_tensor_type="q8_0")["output.weight"] == Q.Q8_0
    mixed = [(n, s, Q.Q6_K if "attn_q" in n else t) for n, s, t in tensors]
    assert choose_types(meta, mixed, "COPY") == {n: t for n, _, t in mixed}


def test_processing_order():
    meta, tensors = llama(12, 256, 512, 4, 4)
    names = [t.name for t in plan_types(meta, list(reversed(tensors)), "Q4_K_M").tensors]
    assert names[:4] == ["output.weight", "output_norm.weight", "rope_freqs.weight", "token_embd.weight"]
    assert names[4:13] == [f"blk.0.{s}.weight" for s in
                           ("attn_k", "attn_norm", "attn_output", "attn_q", "attn_v", "ffn_down", "ffn_gate",
                            "ffn_norm", "ffn_up")]
    assert names.index("blk.2.attn_k.weight") < names.index("blk.10.attn_k.weight")


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 27)), st.randoms(use_true_random=False))
def test_manual_attn_v_never_advance_the_counter(overridden, rnd):
    meta, tensors = LLAMA28
    tensors = list(tensors)
    rnd.shuffle(tensors)  # input order does not matter either
    patterns = [(rf"blk\.{i}\.attn_v", "q8_0") for i in sorted(overridden)]
    v = by(choose_types(meta, tensors, "Q3_K_M", tensor_types=patterns), "attn_v.weight")
    rest = [t for i, t in enumerate(v) if i not in overridden]
    assert rest == [Q.Q5_K, Q.Q5_K][: len(rest)] + [Q.Q4_K] * max(0, len(rest) - 2)
    assert all(v[i] == Q.Q8_0 for i in overridden)


def test_falcon_rules():
    meta = {"general.architecture": "falcon", "falcon.block_count": 32, "falcon.attention.head_count": 71,
            "falcon.attention.head_count_kv": 1}
    tensors = [("token_embd.weight", (4544, 65024), Q.F16), ("output.weight", (4544, 65024), Q.F16)]
    for i in range(32):
        tensors += [(f"blk.{i}.attn_qkv.weight", (4544, 4672), Q.F16),
                    (f"blk.{i}.attn_output.weight", (4544, 4544), Q.F16),
                    (f"blk.{i}.ffn_up.weight", (4544, 18176), Q.F16),
                    (f"blk.{i}.ffn_down.weight", (18176, 4544), Q.F16)]
    q4m = choose_types(meta, tensors, "Q4_K_M")
    assert q4m["output.weight"] == Q.Q8_0
    assert by(q4m, "ffn_down.weight") == [Q.Q6_K if i < 2 else Q.Q5_K if use_more_bits(i, 32) else Q.Q4_K
                                          for i in range(32)]
    q3l = plan_types(meta, tensors, "Q3_K_L")
    # attn_output has 4544 columns: q4_K by the Falcon rule, then the q5_0 fallback
    assert {t.fallback_from for t in q3l.tensors if "attn_output" in t.name} == {Q.Q4_K}
    assert set(by(q3l.types(), "ffn_down.weight")) == {Q.Q4_K}
    q3m = choose_types(meta, tensors, "Q3_K_M")
    assert by(q3m, "ffn_down.weight") == [Q.Q5_K if i < 2 else Q.Q4_K if use_more_bits(i, 32) else Q.Q3_K
                                          for i in range(32)]
    assert set(by(choose_types(meta, tensors, "Q4_K_S"), "ffn_down.weight")) == {Q.Q4_K}


# ---------------------------------------------------------------------------------------------
# Fallback, imatrix requirement, errors, vocabulary
# ---------------------------------------------------------------------------------------------


def test_fallback_table_and_double_fallback():
    meta = {"general.architecture": "llama", "llama.block_count": 1, "llama.attention.head_count": 1}
    def one(ne0, qtype):
        plan = plan_types(meta, [("blk.0.attn_q.weight", (ne0, 8), Q.F16)], "Q8_0", tensor_types=[("", qtype)])
        return plan.tensors[0].target, plan.n_fallback

    assert one(576, "q2_k") == (Q.Q4_0, 1)
    assert one(576, "q3_k") == (Q.Q4_0, 1)
    assert one(576, "q4_k") == (Q.Q5_0, 1)
    assert one(576, "q5_k") == (Q.Q5_1, 1)
    assert one(576, "q6_k") == (Q.Q8_0, 1)
    assert one(576, "iq4_xs") == (Q.IQ4_NL, 1)
    assert one(100, "q4_k") == (Q.F16, 1)
    assert one(100, "q8_0") == (Q.F16, 1)  # measured on llama.cpp, see policy.py
    assert one(512, "q4_k") == (Q.Q4_K, 0)
    with pytest.raises(NoFallbackError, match=r"blk\.0\.attn_q\.weight.*ncols 576.*q8_K"):
        one(576, "q8_k")


def test_q2_k_s_requires_an_imatrix():
    meta, tensors = LLAMA28
    plan = plan_types(meta, tensors, "Q2_K_S")
    needing = {t.name for t in plan.imatrix_required_by}
    assert "blk.5.attn_q.weight" in needing and "token_embd.weight" not in needing
    assert "blk.0.ffn_down.weight" not in needing  # q4_K for the first n/8 layers
    assert not plan_types(meta, tensors, "Q2_K").imatrix_required_by


def test_parse_ftype():
    assert parse_ftype("q4_k_m").name == "Q4_K_M"
    assert parse_ftype("Q4_K").name == "Q4_K_M" and parse_ftype("q3_k").name == "Q3_K_M"
    assert parse_ftype("Q5_K").name == "Q5_K_M"
    assert parse_ftype(15).name == "Q4_K_M" and parse_ftype("7").name == "Q8_0" and parse_ftype(0).name == "F32"
    assert parse_ftype("copy").only_copy
    assert parse_ftype("iq2_xxs").default == Q.IQ2_XXS and parse_ftype(19).name == "IQ2_XXS"
    assert parse_ftype("IQ2_S").default == Q.IQ2_XS and parse_ftype("IQ2_M").default == Q.IQ2_S
    assert parse_ftype("IQ3_XS").default == Q.IQ3_S and parse_ftype("IQ3_M").default == Q.IQ3_S
    assert parse_ftype("MXFP4_MOE").default == Q.MXFP4 and parse_ftype(38).name == "MXFP4_MOE"
    with pytest.raises(PolicyError, match="unknown ftype 'Q9_K'"):
        parse_ftype("Q9_K")
    with pytest.raises(PolicyError, match="Q2_0 is not supported by quantkit: gguf-py 0.19.0 .* has no GGML type Q2_0"):
        parse_ftype("q2_0")
    with pytest.raises(PolicyError, match=r"id 41 \(Q2_0\) is not supported"):
        parse_ftype(41)
    with pytest.raises(PolicyError, match="NVFP4 is not supported by quantkit: llama-quantize does not offer it"):
        parse_ftype("nvfp4")
    with pytest.raises(QuantkitError, match="unknown ftype id 99"):
        parse_ftype(99)


def test_file_type_table():
    """Every file type llama-quantize offers (tools/quantize/quantize.cpp's QUANT_OPTIONS, aliases aside)
    but Q2_0, which gguf-py cannot write."""
    names = [ft.name for ft in FILE_TYPES]
    assert names == ["Q1_0", "Q4_0", "Q4_1", "MXFP4_MOE", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
                     "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "IQ3_XS",
                     "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M",
                     "Q6_K", "Q8_0", "F16", "BF16", "F32", "COPY"]
    ids = {ft.name: ft.ftype_id for ft in FILE_TYPES}
    assert ids["Q5_0"] == 8 and ids["Q8_0"] == 7 and ids["Q2_K_S"] == 21 and ids["BF16"] == 32
    assert ids["IQ4_NL"] == 25 and ids["IQ4_XS"] == 30 and ids["IQ1_M"] == 31 and ids["Q1_0"] == 40
    desc = {ft.name: ft.description for ft in FILE_TYPES}
    assert desc["Q4_K_M"] == "4.58G, +0.1754 ppl @ Llama-3-8B" and desc["COPY"] == "only copy tensors, no quantizing"
    assert parse_ftype("Q2_K_S").default == Q.Q2_K and parse_ftype("Q3_K_L").default == Q.Q3_K


def test_parse_ggml_type_and_tensor_type_arg():
    assert parse_ggml_type("q6_k") == Q.Q6_K and parse_ggml_type("F16") == Q.F16 and parse_ggml_type("Q8_0") == Q.Q8_0
    with pytest.raises(PolicyError, match="unknown ggml type 'q7_k'"):
        parse_ggml_type("q7_k")
    assert parse_tensor_type_arg(r"\.(\d*[13579])\.ATTN_K=q5_k") == (r"\.(\d*[13579])\.attn_k", Q.Q5_K)
    with pytest.raises(PolicyError, match="bad --tensor-type regex"):
        parse_tensor_type_arg("attn_(v=q8_0")
    with pytest.raises(PolicyError, match="malformed"):
        parse_tensor_type_arg("attn_v")
    meta, tensors = LLAMA28
    with pytest.raises(PolicyError, match="bad --tensor-type regex"):
        choose_types(meta, tensors, "Q4_K_M", tensor_types=[("[", "q8_0")])


def test_metadata_forms():
    meta, tensors = LLAMA40
    per_layer = dict(meta, **{"llama.attention.head_count": [40] * 40, "llama.attention.head_count_kv": [8] * 40})
    assert choose_types(per_layer, tensors, "Q2_K") == choose_types(meta, tensors, "Q2_K")
    with pytest.raises(PolicyError, match="general.architecture"):
        choose_types({}, tensors, "Q2_K")


def test_importable_without_numba():
    code = ("import sys, quantkit.policy; "
            "bad = [m for m in sys.modules if m == 'numba' or m.startswith('quantkit.quants')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_check_loadable_wants_llama_cpps_required_hparams():
    """The keys llama.cpp's load_hparams needs (llama-quantize refuses a file without them)."""
    from quantkit.policy import check_loadable

    meta = {"general.architecture": "llama", "llama.context_length": 2048, "llama.embedding_length": 64,
            "llama.block_count": 2, "llama.attention.layer_norm_rms_epsilon": 1e-5}
    check_loadable(meta)
    for key in ("llama.context_length", "llama.embedding_length", "llama.block_count",
                "llama.attention.layer_norm_rms_epsilon"):
        with pytest.raises(PolicyError, match=key.replace(".", r"\.")):
            check_loadable({k: v for k, v in meta.items() if k != key})
    with pytest.raises(PolicyError, match="must be an integer"):
        check_loadable({**meta, "llama.embedding_length": "64"})
    check_loadable({"general.architecture": "falcon", "falcon.context_length": 2048,
                    "falcon.embedding_length": 64, "falcon.block_count": 2})   # no rms eps for falcon
