"""llama-bench's five printers (md, csv, json, jsonl, sql) with its fields, order, widths and quoting."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import TextIO

from quantkit import __version__
from quantkit.errors import BenchError
from quantkit.pipelines.bench.params import BenchParams
from quantkit.pipelines.bench.results import ALL_FIELDS, EXTRA_FIELDS, FIELDS, TestResult, field_type


def _g(x: float) -> str:
    """A double through std::ostream's default format (%g, 6 significant digits)."""
    return f"{x:g}"


class Printer(ABC):
    def __init__(self, out: TextIO):
        self.out = out

    def header(self, params: BenchParams) -> None:
        pass

    @abstractmethod
    def test(self, r: TestResult) -> None:
        """Print one finished test."""

    def footer(self) -> None:
        pass


class CsvPrinter(Printer):
    @staticmethod
    def escape(v: str) -> str:
        return '"' + v.replace('"', '""') + '"'

    def header(self, params):
        self.out.write(",".join(ALL_FIELDS) + "\n")

    def test(self, r):
        self.out.write(",".join(self.escape(v) for v in r.values()) + "\n")


def _json_value(name: str, v: str) -> str:
    t = field_type(name)
    if t == "STRING":
        return json.dumps(v, ensure_ascii=False)
    if t == "BOOL":
        return "false" if v == "0" else "true"
    return v


def _json_items(r: TestResult) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    vals = r.values()
    ref = [(f, _json_value(f, v)) for f, v in zip(FIELDS, vals)]
    extra = [(f, _json_value(f, v)) for f, v in zip(EXTRA_FIELDS, vals[len(FIELDS):])]
    return ref, extra


class JsonPrinter(Printer):
    first = True

    def header(self, params):
        self.out.write("[\n")

    def test(self, r):
        if not self.first:
            self.out.write(",\n")
        self.first = False
        ref, extra = _json_items(r)
        w = self.out.write
        w("  {\n")
        for f, v in ref:
            w(f'    "{f}": {v},\n')
        w(f'    "samples_ns": [ {", ".join(str(t) for t in r.samples_ns)} ],\n')
        w(f'    "samples_ts": [ {", ".join(_g(t) for t in r.samples_ts)} ],\n')
        w(",\n".join(f'    "{f}": {v}' for f, v in extra) + "\n")
        w("  }")
        self.out.flush()

    def footer(self):
        self.out.write("\n]\n")


class JsonlPrinter(Printer):
    def test(self, r):
        ref, extra = _json_items(r)
        s = "{" + "".join(f'"{f}": {v}, ' for f, v in ref)
        s += f'"samples_ns": [ {", ".join(str(t) for t in r.samples_ns)} ],'
        s += f'"samples_ts": [ {", ".join(_g(t) for t in r.samples_ts)} ]'
        s += "".join(f', "{f}": {v}' for f, v in extra) + "}\n"
        self.out.write(s)
        self.out.flush()


class SqlPrinter(Printer):
    SQL_TYPE = {"STRING": "TEXT", "BOOL": "INTEGER", "INT": "INTEGER", "FLOAT": "REAL"}

    def header(self, params):
        w = self.out.write
        w("CREATE TABLE IF NOT EXISTS llama_bench (\n")
        for k, f in enumerate(ALL_FIELDS):
            w(f"  {f} {self.SQL_TYPE[field_type(f)]}{',' if k < len(ALL_FIELDS) - 1 else ''}\n")
        w(");\n\n")

    def test(self, r):
        vals = ", ".join("'" + v.replace("'", "''") + "'" for v in r.values())
        self.out.write(f"INSERT INTO llama_bench ({', '.join(ALL_FIELDS)}) VALUES ({vals});\n")


class MarkdownPrinter(Printer):
    WIDTH = {"model": -30, "t/s": 20, "size": 10, "params": 10, "n_threads": 7, "n_batch": 7, "n_ubatch": 8,
             "test": 15}
    DISPLAY = {"n_threads": "threads"}

    def __init__(self, out):
        super().__init__(out)
        self.fields: list[str] = []
        self.types: dict[str, None] = {}  # the matrix types of the models benchmarked, in order

    @classmethod
    def width(cls, f: str) -> int:
        if f in cls.WIDTH:
            return cls.WIDTH[f]
        w = max(len(f), 10)
        return -w if field_type(f) == "STRING" else w

    def header(self, params):
        self.fields = ["model", "size", "params", "backend", "n_threads"]  # threads: always on CPU
        self.fields += [f for f in ("cpu_mask", "cpu_strict", "n_batch", "n_ubatch") if params.non_default(f)]
        self.fields += ["test", "t/s"]
        head = sep = "|"
        for f in self.fields:
            w = self.width(f)
            head += f" {self._pad(self.DISPLAY.get(f, f), w)} |"
            sep += f" {'-' * (abs(w) - 1)}{':' if w > 0 else '-'} |"
        self.out.write(head + "\n" + sep + "\n")

    @staticmethod
    def _pad(s: str, w: int) -> str:
        return s.ljust(-w) if w < 0 else s.rjust(w)

    @staticmethod
    def cell(f: str, r: TestResult) -> str:
        m = r.model
        if f == "model":
            return m.desc
        if f == "size":
            return f"{m.size / 1024 / 1024:.2f} MiB" if m.size < 1024**3 else f"{m.size / 1024**3:.2f} GiB"
        if f == "params":
            return f"{m.n_params / 1e6:.2f} M" if m.n_params < 1000**3 else f"{m.n_params / 1e9:.2f} B"
        if f == "backend":
            return "CPU"
        if f == "test":
            return r.inst.name
        if f == "t/s":
            return f"{r.avg_ts:.2f} ± {r.stdev_ts:.2f}"
        return r.as_dict()[f]

    def test(self, r):
        self.types.update(dict.fromkeys(r.model.matrix_types))
        self.out.write("|" + "".join(f" {self._pad(self.cell(f, r), self.width(f))} |" for f in self.fields) + "\n")

    def footer(self):
        from quantkit import isa
        from quantkit.kernels.cpu_traits import describe

        # llama-bench's build line; quantkit's kernels depend on the CPU level, so it says which ran, and
        # before it at which level each matrix type's row dot, x8 decode and GEMM ran (the type's record)
        if self.types:
            self.out.write(f"\nkernels by type: {describe(self.types)}\n")
        self.out.write(f"\nbuild: quantkit-{__version__} (0), kernels: {isa.describe()}\n")


PRINTERS: dict[str, type[Printer]] = {"csv": CsvPrinter, "json": JsonPrinter, "jsonl": JsonlPrinter,
                                      "md": MarkdownPrinter, "sql": SqlPrinter}


def make_printer(fmt: str, out: TextIO) -> Printer:
    try:
        return PRINTERS[fmt](out)
    except KeyError:
        raise BenchError(f"unknown output format {fmt!r} (one of {', '.join(PRINTERS)})") from None
