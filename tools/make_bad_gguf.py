"""Write the corpus of broken GGUF files under tests/data/bad/ (small, deterministic).

    .venv/bin/python tools/make_bad_gguf.py

Every file starts from one tiny valid llama model (written here byte by byte with struct, so that each
damage can be placed exactly) and breaks one thing. The test suite (tests/test_hostile.py) feeds each
file to every command that opens a model and expects one line naming the file, exit code 1, quickly.
A manifest (bad/MANIFEST.txt) says what each file breaks.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "bad"

# GGUF value types
U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10
ALIGN = 32


def s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key, v):
    return kv(key, U32, struct.pack("<I", v))


def kv_f32(key, v):
    return kv(key, F32, struct.pack("<f", v))


def kv_str(key, v):
    return kv(key, STR, s(v))


def kv_str_arr(key, items):
    return kv(key, ARR, struct.pack("<IQ", STR, len(items)) + b"".join(s(x) for x in items))


def kv_i32_arr(key, items):
    return kv(key, ARR, struct.pack("<IQ", I32, len(items)) + struct.pack(f"<{len(items)}i", *items))


N_EMBD, N_FF, N_VOCAB = 16, 32, 8


def base_kvs() -> list[bytes]:
    toks = [f"t{i}" for i in range(N_VOCAB)]
    return [
        kv_str("general.architecture", "llama"),
        kv_u32("llama.block_count", 1),
        kv_u32("llama.context_length", 64),
        kv_u32("llama.embedding_length", N_EMBD),
        kv_u32("llama.feed_forward_length", N_FF),
        kv_u32("llama.attention.head_count", 2),
        kv_u32("llama.attention.head_count_kv", 2),
        kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
        kv_str("tokenizer.ggml.model", "gpt2"),
        kv_str_arr("tokenizer.ggml.tokens", toks),
        kv_i32_arr("tokenizer.ggml.token_type", [1] * N_VOCAB),
        kv_str_arr("tokenizer.ggml.merges", ["t 0"]),
    ]


def base_tensors():
    """(name, ne, ggml type, bytes) of a one-layer llama with F32 weights."""
    rng = np.random.default_rng(7)

    def f32(*ne):
        return rng.standard_normal(int(np.prod(ne))).astype(np.float32).tobytes()

    names = [("token_embd.weight", (N_EMBD, N_VOCAB)), ("output_norm.weight", (N_EMBD,)),
             ("blk.0.attn_norm.weight", (N_EMBD,)), ("blk.0.attn_q.weight", (N_EMBD, N_EMBD)),
             ("blk.0.attn_k.weight", (N_EMBD, N_EMBD)), ("blk.0.attn_v.weight", (N_EMBD, N_EMBD)),
             ("blk.0.attn_output.weight", (N_EMBD, N_EMBD)), ("blk.0.ffn_norm.weight", (N_EMBD,)),
             ("blk.0.ffn_gate.weight", (N_EMBD, N_FF)), ("blk.0.ffn_up.weight", (N_EMBD, N_FF)),
             ("blk.0.ffn_down.weight", (N_FF, N_EMBD))]
    return [(n, ne, 0, f32(*ne)) for n, ne in names]


def pad(n: int) -> int:
    return (ALIGN - n % ALIGN) % ALIGN


def build(kvs=None, tensors=None, *, magic=b"GGUF", version=3, n_kv=None, n_tensors=None,
          offsets=None, info_override=None) -> bytes:
    kvs = base_kvs() if kvs is None else kvs
    tensors = base_tensors() if tensors is None else tensors
    head = magic + struct.pack("<I", version)
    head += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    body = b"".join(kvs)
    infos = b""
    data = b""
    offs = []
    for i, (name, ne, t, raw) in enumerate(tensors):
        off = len(data) if offsets is None else offsets[i]
        offs.append(off)
        if info_override and name in info_override:
            infos += info_override[name]
        else:
            infos += s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", t, off)
        data += raw + b"\0" * pad(len(raw))
    meta = head + body + infos
    return meta + b"\0" * pad(len(meta)) + data


def cases() -> dict[str, tuple[str, bytes]]:
    good = build()
    kvs = base_kvs()
    tens = base_tensors()
    hdr = 4 + 4 + 16
    kv_end = hdr + sum(len(k) for k in kvs)
    out: dict[str, tuple[str, bytes]] = {}
    out["wrong_magic"] = ("magic is not GGUF", b"GGML" + good[4:])
    out["version_99"] = ("unsupported GGUF version", build(version=99))
    out["version_1"] = ("GGUF version 1 (no longer supported)", build(version=1))
    out["empty"] = ("empty file", b"")
    out["trunc_header"] = ("truncated inside the header", good[:10])
    out["trunc_kv"] = ("truncated in the middle of the metadata", good[:kv_end - 40])
    out["trunc_tensor_info"] = ("truncated in the tensor infos", good[:kv_end + 30])
    data_start = len(good) - sum(len(r) + pad(len(r)) for *_, r in tens)
    out["trunc_before_data"] = ("truncated where tensor data starts", good[:data_start])
    out["trunc_in_data"] = ("truncated inside the last tensor's data", good[:len(good) - 100])
    out["huge_tensor_count"] = ("tensor count 2^40", build(n_tensors=1 << 40))
    out["huge_kv_count"] = ("metadata key count 2^40", build(n_kv=1 << 40))
    bad_str = struct.pack("<Q", 1 << 50) + b"general.architecture" + struct.pack("<I", STR) + s("llama")
    out["string_len_beyond_file"] = ("a key length of 2^50 bytes", build(kvs=[bad_str] + kvs[1:]))
    out["unknown_value_type"] = ("metadata value type 99", build(kvs=kvs[:1] + [kv("x.y", 99, b"\0" * 8)] + kvs[1:]))
    offsets = [0] * len(tens)
    off = 0
    for i, (*_, raw) in enumerate(tens):
        offsets[i] = off
        off += len(raw) + pad(len(raw))
    far = list(offsets)
    far[3] = 1 << 40
    out["offset_outside_data"] = ("a tensor offset far past the end of the file", build(offsets=far))
    over = list(offsets)
    over[4] = over[3]
    out["overlapping_tensors"] = ("two tensors share the same bytes", build(offsets=over))
    mis = list(offsets)
    mis[3] += 4
    out["misaligned_offset"] = ("a tensor offset not a multiple of the alignment", build(offsets=mis))
    ut = list(tens)
    ut[3] = (ut[3][0], ut[3][1], 99, ut[3][3])
    out["unknown_tensor_type"] = ("ggml tensor type 99", build(tensors=ut))
    name, ne, t, raw = tens[3]
    info = s(name) + struct.pack("<I", 2) + struct.pack("<2Q", 1 << 33, 1 << 33) + struct.pack("<IQ", 0, offsets[3])
    out["dims_overflow"] = ("dimensions whose product overflows 64 bits", build(info_override={name: info}))
    zero = s(name) + struct.pack("<I", 2) + struct.pack("<2Q", 0, N_EMBD) + struct.pack("<IQ", 0, offsets[3])
    out["zero_dim"] = ("a dimension of 0", build(info_override={name: zero}))
    dup = list(tens)
    dup[4] = (dup[3][0], dup[4][1], dup[4][2], dup[4][3])
    out["duplicate_tensor_names"] = ("two tensors named blk.0.attn_q.weight", build(tensors=dup))
    dupk = kvs[:2] + [kv_u32("llama.block_count", 1)] + kvs[2:]
    out["duplicate_keys"] = ("llama.block_count twice", build(kvs=dupk))
    sb = [kv_str("llama.block_count", "one") if k.startswith(s("llama.block_count")) else k for k in kvs]
    out["string_block_count"] = ("llama.block_count is a string", build(kvs=sb))
    nb = [k for k in kvs if not k.startswith(s("llama.embedding_length"))]
    out["missing_embedding_length"] = ("llama.embedding_length missing", build(kvs=nb))
    noa = [k for k in kvs if not k.startswith(s("general.architecture"))]
    out["missing_architecture"] = ("general.architecture missing", build(kvs=noa))
    nt = [x for x in tens if x[0] != "blk.0.ffn_down.weight"]
    out["missing_tensor"] = ("blk.0.ffn_down.weight missing", build(tensors=nt))
    wrong = list(tens)
    wrong[3] = (wrong[3][0], (N_EMBD, N_EMBD // 2), 0, wrong[3][3][: N_EMBD * N_EMBD * 2])
    out["wrong_shape"] = ("blk.0.attn_q.weight has half its rows", build(tensors=wrong))
    align = kvs + [kv_u32("general.alignment", 3)]
    out["bad_alignment"] = ("general.alignment is 3 (not a power of two)", build(kvs=align))
    return out


def imatrix_gguf(entries, *, meta=True, drop_counts=False, counts_len=None) -> bytes:
    """An imatrix in llama-imatrix's GGUF layout, written with gguf-py to a temporary file."""
    import tempfile

    import gguf

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "i.gguf"
        w = gguf.GGUFWriter(str(path), arch="")
        w.kv_data = [{}]
        w.add_string("general.type", "imatrix")
        if meta:
            w.add_array("imatrix.datasets", ["bad"])
            w.add_uint32("imatrix.chunk_count", 1)
            w.add_uint32("imatrix.chunk_size", 16)
        for name, sums in entries:
            n = counts_len or 1
            if not drop_counts:
                w.add_tensor(f"{name}.counts", np.full((1, n), 16.0, np.float32))
            w.add_tensor(f"{name}.in_sum2", sums.reshape(1, -1).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


def imatrix_dat(entries, n_entries=None, trailer=True) -> bytes:
    out = struct.pack("<i", len(entries) if n_entries is None else n_entries)
    for name, ncall, vals in entries:
        b = name.encode()
        out += struct.pack("<i", len(b)) + b + struct.pack("<ii", ncall, len(vals)) + np.asarray(vals, "<f4").tobytes()
    if trailer:
        out += struct.pack("<i", 1) + struct.pack("<i", 3) + b"bad"
    return out


def imatrix_cases() -> dict[str, tuple[str, bytes]]:
    ok = np.ones(N_EMBD, np.float32)
    nan = ok.copy()
    nan[3] = np.nan
    q = "blk.0.attn_q.weight"
    good_dat = imatrix_dat([(q, 1, ok)])
    return {
        "imatrix_dat_truncated.dat": ("a .dat cut inside its first entry", good_dat[:30]),
        "imatrix_dat_huge_count.dat": ("a .dat claiming 2^30 entries", imatrix_dat([(q, 1, ok)], n_entries=1 << 30)),
        "imatrix_dat_nan.dat": ("a .dat with a NaN value", imatrix_dat([(q, 1, nan)])),
        "imatrix_dat_huge_nval.dat": ("a .dat entry claiming 2^30 values", good_dat[:4 + 4 + len(q) + 4]
                                      + struct.pack("<i", 1 << 30) + good_dat[4 + 4 + len(q) + 8:]),
        "imatrix_gguf_nan.gguf": ("a GGUF imatrix with a NaN sum", imatrix_gguf([(q, nan)])),
        "imatrix_gguf_no_counts.gguf": ("in_sum2 without its counts", imatrix_gguf([(q, ok)], drop_counts=True)),
        "imatrix_gguf_wrong_counts.gguf": ("counts for 3 experts, sums for 1", imatrix_gguf([(q, ok)], counts_len=3)),
        "imatrix_gguf_no_metadata.gguf": ("the imatrix.* keys missing", imatrix_gguf([(q, ok)], meta=False)),
        "imatrix_wrong_width.gguf": ("an entry 7 columns wide for a 16-wide weight", imatrix_gguf([(q, np.ones(7))])),
    }


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.gguf"):
        old.unlink()
    lines = []
    for name, (what, blob) in sorted(cases().items()):
        (OUT / f"{name}.gguf").write_bytes(blob)
        lines.append(f"{name}.gguf\t{len(blob)}\t{what}")
    for old in list(OUT.glob("imatrix_*")):
        old.unlink()
    im_lines = []
    for name, (what, blob) in sorted(imatrix_cases().items()):
        (OUT / name).write_bytes(blob)
        im_lines.append(f"{name}\t{len(blob)}\t{what}")
    (OUT / "MANIFEST.txt").write_text("file\tbytes\twhat is broken\n" + "\n".join(lines) + "\n")
    (OUT / "IMATRIX_MANIFEST.txt").write_text("file\tbytes\twhat is broken\n" + "\n".join(im_lines) + "\n")
    (OUT / "good.gguf").write_bytes(build())
    print(f"wrote {len(lines)} broken files (+ good.gguf) to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
