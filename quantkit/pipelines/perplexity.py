"""Perplexity and KL divergence, as llama-perplexity computes them (tools/perplexity/perplexity.cpp).

The procedure (tools/perplexity/perplexity.cpp, ``perplexity()`` and ``kl_divergence()``):

* The text is tokenized once (BOS added when the vocabulary asks for it). At least ``2*n_ctx`` tokens
  are needed. It is cut into ``tokens // n_ctx`` chunks (``--chunks`` caps the count).
* Each chunk is evaluated from an empty KV cache; its first token is replaced by BOS when the vocab
  adds BOS. Only the second half is scored: the logits at positions ``n_ctx/2 .. n_ctx-2`` predict the
  next token, ``n_ctx - 1 - n_ctx/2`` tokens per chunk.
* ``nll`` = -log softmax(logits)[next]; PPL = exp(mean nll); the error printed with the final estimate
  is ``PPL * sqrt(var(nll) / (count - 1))``.

The KL-divergence base file (``--kl-divergence-base``) is llama.cpp's byte layout, so files move
between the two tools (``quantkit.formats.logits``); it is written atomically (an interrupted run
leaves no file).

Scoring is vectorized numpy over a chunk's scored rows with llama.cpp's float32/float64 mix: exp in
float32, the sum of exponentials in float64, ``log_sum_exp`` rounded to float32.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from quantkit.errors import QuantkitError
from quantkit.formats.logits import LogitsFile, LogitsWriter, n_vocab_padded
from quantkit.jit import njit_fast_parallel, prange
from quantkit.pipelines.chunks import ChunkState, Log, chunk_targets, count_chunks, run_chunks
from quantkit.model.decode import expf, max_f32


class PerplexityError(QuantkitError):
    """A request llama-perplexity would refuse (a base logits file from another model or context)."""


# -- per-token scoring (numpy over a chunk's scored rows) --------------------------------------

@njit_fast_parallel
def _softmax_rows(logits, mx, lse):
    """Per row: mx = max, lse = log of the float64 sum of exp(logit - max) (float32 exps). One row per
    iteration, so the values do not depend on the thread count."""
    n, nv = logits.shape
    for r in prange(n):
        m = max_f32(logits[r], nv)
        s = 0.0
        for j in range(nv):
            s += np.float64(expf(logits[r, j] - m))
        mx[r] = m
        lse[r] = np.float32(np.log(s))


def _softmax_parts(logits: np.ndarray):
    """max (float32), log_sum_exp (float32, from a float64 sum of float32 exps), per row."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    mx = np.empty(logits.shape[0], np.float32)
    lse = np.empty(logits.shape[0], np.float32)
    _softmax_rows(logits, mx, lse)
    return mx, lse


def nll_rows(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """float64 negative log-likelihood of ``targets`` under each row of ``logits`` (n, n_vocab)."""
    mx, lse = _softmax_parts(logits)
    tl = logits[np.arange(logits.shape[0]), targets]
    return -((tl - mx).astype(np.float64) - lse.astype(np.float64))


def quantize_log_probs(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's ``log_softmax(n_vocab, logits, log_prob, tok)`` over rows: (uint16 (n, nv), nll float64)."""
    n, nvocab = logits.shape
    nv = n_vocab_padded(nvocab)
    mx, lse = _softmax_parts(logits)
    mn = np.maximum(logits.min(axis=1), mx - np.float32(16))
    min_log_prob = ((mn - mx) - lse).astype(np.float32)
    scale = ((mx - mn) / np.float32(65535.0)).astype(np.float32)
    out = np.zeros((n, nv), dtype=np.uint16)
    head = out[:, :4].view(np.float32)                   # (n, 2): scale, min_log_prob
    head[:, 0] = scale
    head[:, 1] = min_log_prob
    for r in range(n):
        if scale[r] != 0:
            inv = np.float32(1.0) / scale[r]
            row = logits[r]
            q = np.rint(inv * (row - mn[r])).astype(np.int64)     # nearest_int: round half to even
            q = np.where(row > mn[r], q, 0)
            out[r, 4:4 + nvocab] = q.astype(np.uint16)
    tl = logits[np.arange(n), targets]
    nll = ((mx + lse) - tl).astype(np.float64)
    return out, nll


@dataclass
class KLDSums:
    """llama.cpp's ``kl_divergence_result`` plus the per-token values for the percentiles."""

    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list = field(default_factory=list)
    p_diff_values: list = field(default_factory=list)

    _SUMS = ("sum_nll", "sum_nll2", "sum_nll_base", "sum_nll_base2", "sum_nll_nll_base", "sum_kld", "sum_kld2",
             "sum_p_diff", "sum_p_diff2", "sum_p_diff4")

    def merge(self, c: "KLDSums") -> None:
        """Add one chunk's sums (in llama.cpp's order of fields; each a single float64 addition)."""
        for k in self._SUMS:
            setattr(self, k, getattr(self, k) + getattr(c, k))
        self.max_p_diff = max(self.max_p_diff, c.max_p_diff)
        self.n_same_top += c.n_same_top
        self.count += c.count
        self.kld_values += c.kld_values
        self.p_diff_values += c.p_diff_values

    def to_record(self) -> dict:
        rec = {k: getattr(self, k) for k in (*self._SUMS, "max_p_diff", "n_same_top", "count")}
        rec["kld_values"] = [v.tolist() for v in self.kld_values]
        rec["p_diff_values"] = [v.tolist() for v in self.p_diff_values]
        return rec

    @classmethod
    def from_record(cls, rec: dict) -> "KLDSums":
        c = cls(**{k: rec[k] for k in (*cls._SUMS, "max_p_diff", "n_same_top", "count")})
        c.kld_values = [np.asarray(v, np.float32) for v in rec["kld_values"]]
        c.p_diff_values = [np.asarray(v, np.float32) for v in rec["p_diff_values"]]
        return c


@njit_fast_parallel
def _kld_scan(logits, q, scale, min_lp, mxl, kld, imax_base):
    """Per row r, with the base log-probs lb = scale * q + min_lp (float32, as stored): kld[r] = the
    float64 sum over lb > -16 of exp(lb) * (lb - logit + mxl), mxl = max + log_sum_exp of the row's
    logits; imax_base[r] = the first index of the largest lb (llama.cpp's choice on 16-bit ties)."""
    n, nv = logits.shape
    for r in prange(n):
        sc = scale[r]
        mn = min_lp[r]
        m = mxl[r]
        best = np.float32(-np.inf)
        bi = 0
        s = 0.0
        for j in range(nv):
            lb = sc * np.float32(q[r, j]) + mn
            if lb > best:
                best = lb
                bi = j
            if lb > np.float32(-16.0):
                s += np.float64(expf(lb) * ((lb - logits[r, j]) + m))
        kld[r] = s
        imax_base[r] = bi


def kld_rows(logits: np.ndarray, base: np.ndarray, targets: np.ndarray, acc: KLDSums) -> None:
    """Compare rows of logits with the base file's quantized log-probs (n, nv); add into ``acc``."""
    acc.merge(kld_chunk(logits, base, targets))


def kld_chunk(logits: np.ndarray, base: np.ndarray, targets: np.ndarray) -> KLDSums:
    """One chunk's KLDSums: rows of logits against the base file's quantized log-probs (n, nv)."""
    acc = KLDSums()
    n, nvocab = logits.shape
    mx, lse = _softmax_parts(logits)
    imax = logits.argmax(axis=1)
    head = np.ascontiguousarray(base[:, :4]).view(np.float32)
    scale, min_lp = head[:, 0], head[:, 1]
    rows = np.arange(n)
    tl = logits[rows, targets]
    nll = ((mx + lse) - tl).astype(np.float32)
    q = base[:, 4:4 + nvocab]
    nll_base = -(scale * q[rows, targets].astype(np.float32) + min_lp)
    mxl = (mx + lse).astype(np.float32)
    kld = np.empty(n, np.float64)
    imax_base = np.empty(n, np.int64)
    _kld_scan(np.ascontiguousarray(logits, dtype=np.float32), np.ascontiguousarray(q), np.ascontiguousarray(scale),
              np.ascontiguousarray(min_lp), mxl, kld, imax_base)
    p_base = np.exp(-nll_base)
    p = np.exp(-nll)
    p_diff = (p - p_base).astype(np.float32)
    nll64, nllb64, pd64 = nll.astype(np.float64), nll_base.astype(np.float64), p_diff.astype(np.float64)
    acc.sum_nll += nll64.sum()
    acc.sum_nll2 += (nll64 * nll64).sum()
    acc.sum_nll_base += nllb64.sum()
    acc.sum_nll_base2 += (nllb64 * nllb64).sum()
    acc.sum_nll_nll_base += (nll64 * nllb64).sum()
    acc.sum_kld += kld.sum()
    acc.sum_kld2 += (kld * kld).sum()
    acc.sum_p_diff += pd64.sum()
    acc.sum_p_diff2 += (pd64 ** 2).sum()
    acc.sum_p_diff4 += (pd64 ** 4).sum()
    acc.max_p_diff = max(acc.max_p_diff, float(np.abs(p_diff).max()))
    acc.n_same_top += int((imax == imax_base).sum())
    acc.count += n
    acc.kld_values.append(kld.astype(np.float32))
    acc.p_diff_values.append(p_diff)
    return acc


# -- the runs ----------------------------------------------------------------------------------

@dataclass
class PerplexityResult:
    n_ctx: int
    n_chunk: int
    count: int = 0
    nll: float = 0.0
    nll2: float = 0.0
    running: list = field(default_factory=list)     # cumulative PPL after each chunk
    seconds: float = 0.0
    first_pass_s: float = 0.0

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    @property
    def ppl_err(self) -> float:
        """``PPL * sqrt(var(nll)/(count-1))``; NaN when the variance is not positive (the reference
        then prints 'Unexpected negative standard deviation of log(prob)')."""
        m = self.nll / self.count
        var = self.nll2 / self.count - m * m
        if var <= 0 or self.count < 2:
            return float("nan")
        return math.sqrt(var / (self.count - 1)) * self.ppl

    def add(self, nll: np.ndarray) -> float:
        return self.add_sums(chunk_sums(nll))

    def add_sums(self, sums: list) -> float:
        """Add one chunk's ``[sum nll, sum nll^2, count]``; the running PPL."""
        self.nll += sums[0]
        self.nll2 += sums[1]
        self.count += int(sums[2])
        self.running.append(self.ppl)
        return self.ppl

    def final_line(self) -> str:
        err = self.ppl_err
        if math.isnan(err):
            return "Unexpected negative standard deviation of log(prob)"
        return f"Final estimate: PPL = {self.ppl:.4f} +/- {err:.5f}"


def chunk_sums(nll: np.ndarray) -> list:
    return [float(nll.sum()), float((nll * nll).sum()), int(nll.size)]


def perplexity(runner, tokens: np.ndarray, n_ctx: int, n_chunks: int, bos: int | None,
               base_out: str | os.PathLike | None = None, log: Log | None = None,
               on_chunk: Callable[[int, float], None] | None = None, state: ChunkState | None = None,
               check: Callable[[], None] = lambda: None) -> PerplexityResult:
    """Run the chunks and score their second halves. ``base_out``: also write the KL base file.
    ``state``: continue after the chunks it holds and save each new chunk's sums into it."""
    n_chunk = count_chunks(tokens.size, n_ctx, n_chunks)
    first = n_ctx // 2
    res = PerplexityResult(n_ctx, n_chunk)
    if base_out and state is not None and state.records:
        raise PerplexityError("writing a base logits file cannot be resumed (its first chunks are gone)")
    done = _replay(state, lambda i, rec: res.add_sums(rec), on_chunk)
    writer = None
    if base_out:
        writer = LogitsWriter(base_out, n_ctx, runner.config.n_vocab, n_chunk, tokens).open()

    def chunk(i: int, logits: np.ndarray) -> None:
        targets = chunk_targets(tokens, i, n_ctx)
        if writer is not None:
            q, nll = quantize_log_probs(logits, targets)
            writer.write_chunk(q)
        else:
            nll = nll_rows(logits, targets)
        sums = chunk_sums(nll)
        if state is not None:
            state.append(sums)
        ppl = res.add_sums(sums)
        if on_chunk:
            on_chunk(i, ppl)

    try:
        times = run_chunks(runner, tokens, n_ctx, n_chunk, bos, np.arange(first, n_ctx - 1), chunk, start=done,
                           log=log, check=check, name="perplexity")
        if writer is not None:
            writer.commit()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    res.seconds, res.first_pass_s = times.seconds, times.first_pass_s
    return res


def _replay(state: ChunkState | None, apply: Callable, on_chunk: Callable | None) -> int:
    """Apply a resumed run's saved chunks in order (as they were applied when computed); how many."""
    if state is None:
        return 0
    for i, rec in enumerate(state.records):
        value = apply(i, rec)
        if on_chunk:
            on_chunk(i, value)
    return len(state.records)


def _mean_unc(s: float, s2: float, n: int) -> tuple[float, float]:
    if n < 1:
        return 0.0, 0.0
    f = s / n
    df = s2 / n - f * f
    df = math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0
    return f, df


def _cov(a: float, b: float, ab: float, n: int) -> float:
    if n < 10:
        return 0.0
    return (ab / n - (a / n) * (b / n)) / (n - 1)


def _percentile(v: np.ndarray, fraction: float) -> float:
    """llama.cpp's linear-interpolation percentile on sorted float32 values (float32 arithmetic)."""
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    p = np.float32(fraction) * np.float32(v.size - 1)
    ip = int(p)
    p = np.float32(p - ip)
    return float((np.float32(1) - p) * v[ip] + p * v[min(ip + 1, v.size - 1)])


def _median(v: np.ndarray) -> float:
    n = v.size
    return float(np.float32(0.5) * (v[n // 2] + v[n // 2 - 1])) if n % 2 == 0 else float(v[n // 2])


@dataclass
class KLDResult:
    sums: KLDSums
    n_ctx: int
    n_chunk: int
    seconds: float = 0.0
    first_pass_s: float = 0.0

    def chunk_line(self, i: int) -> str:
        k = self.sums
        lp, lpu = _mean_unc(k.sum_nll, k.sum_nll2, k.count)
        ppl = math.exp(lp)
        lb, lbu = _mean_unc(k.sum_nll_base, k.sum_nll_base2, k.count)
        cov = _cov(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, k.count)
        ratio_unc = math.sqrt(max(0.0, lpu * lpu + lbu * lbu - 2.0 * cov))
        kl, klu = _mean_unc(k.sum_kld, k.sum_kld2, k.count)
        mse, mseu = _mean_unc(k.sum_p_diff2, k.sum_p_diff4, k.count)
        rms = math.sqrt(mse)
        rms_unc = 0.5 / rms * mseu if rms > 0 else 0.0
        top = k.n_same_top / k.count
        top_unc = math.sqrt(top * (1 - top) / (k.count - 1)) if k.count > 1 else 0.0
        return (f"{i:4d}    {ppl:9.4f} ± {ppl * lpu:9.4f}    {lp - lb:10.5f} ± {ratio_unc:10.5f}"
                f"    {kl:10.5f} ± {klu:10.5f}    {100 * rms:6.3f} ± {100 * rms_unc:6.3f} %"
                f"    {100 * top:6.3f} ± {100 * top_unc:6.3f} %")

    def stats(self) -> dict:
        """The final numbers as a dict (also what the report prints)."""
        k = self.sums
        lp, lpu = _mean_unc(k.sum_nll, k.sum_nll2, k.count)
        lb, lbu = _mean_unc(k.sum_nll_base, k.sum_nll_base2, k.count)
        cov = _cov(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, k.count)
        kl, klu = _mean_unc(k.sum_kld, k.sum_kld2, k.count)
        pd, pdu = _mean_unc(k.sum_p_diff, k.sum_p_diff2, k.count)
        mse, mseu = _mean_unc(k.sum_p_diff2, k.sum_p_diff4, k.count)
        top = k.n_same_top / k.count
        return {
            "count": k.count, "ppl": math.exp(lp), "ppl_unc": math.exp(lp) * lpu,
            "ppl_base": math.exp(lb), "ppl_base_unc": math.exp(lb) * lbu,
            "cor": cov / (lpu * lbu) if lpu * lbu > 0 else float("nan"),
            "ln_ratio": lp - lb, "ln_ratio_unc": math.sqrt(max(0.0, lpu * lpu + lbu * lbu - 2 * cov)),
            "kld": kl, "kld_unc": klu, "p_diff": pd, "p_diff_unc": pdu,
            "rms_p_diff": math.sqrt(mse), "rms_p_diff_unc": 0.5 / math.sqrt(mse) * mseu if mse > 0 else 0.0,
            "same_top": top, "same_top_unc": math.sqrt(top * (1 - top) / (k.count - 1)) if k.count > 1 else 0.0,
        }

    def report(self) -> list[str]:
        """llama.cpp's three final sections (nothing when fewer than 100 tokens were compared)."""
        k = self.sums
        if k.count < 100:
            return []
        s = self.stats()
        kv = np.sort(np.concatenate(k.kld_values))
        pv = np.sort(np.concatenate(k.p_diff_values))
        ppl, ppl_b = s["ppl"], s["ppl_base"]
        lpu = s["ppl_unc"] / ppl
        lbu = s["ppl_base_unc"] / ppl_b
        cov = _cov(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, k.count)
        ratio = math.exp(s["ln_ratio"])
        ppl_cov = ppl * ppl_b * cov
        diff_unc = math.sqrt(max(0.0, s["ppl_unc"] ** 2 + s["ppl_base_unc"] ** 2 - 2.0 * ppl_cov))
        del lpu, lbu
        out = [
            "====== Perplexity statistics ======",
            f"Mean PPL(Q)                   : {ppl:10.6f} ± {s['ppl_unc']:10.6f}",
            f"Mean PPL(base)                : {ppl_b:10.6f} ± {s['ppl_base_unc']:10.6f}",
            f"Cor(ln(PPL(Q)), ln(PPL(base))): {100.0 * s['cor']:6.2f}%",
            f"Mean ln(PPL(Q)/PPL(base))     : {s['ln_ratio']:10.6f} ± {s['ln_ratio_unc']:10.6f}",
            f"Mean PPL(Q)/PPL(base)         : {ratio:10.6f} ± {ratio * s['ln_ratio_unc']:10.6f}",
            f"Mean PPL(Q)-PPL(base)         : {ppl - ppl_b:10.6f} ± {diff_unc:10.6f}",
            "",
            "====== KL divergence statistics ======",
            f"Mean    KLD: {s['kld']:10.6f} ± {s['kld_unc']:10.6f}",
            f"Maximum KLD: {kv[-1]:10.6f}",
        ]
        for label, f in (("99.9%", .999), ("99.0%", .99), ("95.0%", .95), ("90.0%", .9)):
            out.append(f"{label}   KLD: {_percentile(kv, f):10.6f}")
        out.append(f"Median  KLD: {_median(kv):10.6f}")
        for label, f in (("10.0%", .1), (" 5.0%", .05), (" 1.0%", .01), (" 0.1%", .001)):
            out.append(f"{label}   KLD: {_percentile(kv, f):10.6f}")
        out += [f"Minimum KLD: {kv[0]:10.6f}", "", "====== Token probability statistics ======",
                f"Mean    Δp: {100 * s['p_diff']:6.3f} ± {100 * s['p_diff_unc']:5.3f} %",
                f"Maximum Δp: {100 * pv[-1]:6.3f}%"]
        for label, f in (("99.9%", .999), ("99.0%", .99), ("95.0%", .95), ("90.0%", .9), ("75.0%", .75)):
            out.append(f"{label}   Δp: {100 * _percentile(pv, f):6.3f}%")
        out.append(f"Median  Δp: {100 * _median(pv):6.3f}%")
        for label, f in (("25.0%", .25), ("10.0%", .1), (" 5.0%", .05), (" 1.0%", .01), (" 0.1%", .001)):
            out.append(f"{label}   Δp: {100 * _percentile(pv, f):6.3f}%")
        out += [f"Minimum Δp: {100 * pv[0]:6.3f}%",
                f"RMS Δp    : {100 * s['rms_p_diff']:6.3f} ± {100 * s['rms_p_diff_unc']:5.3f} %",
                f"Same top p: {100 * s['same_top']:6.3f} ± {100 * s['same_top_unc']:5.3f} %"]
        return out


KLD_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
              "              Δp RMS            Same top p")


def check_base(base: LogitsFile, n_vocab: int, n_ctx_train: int, n_ctx: int | None) -> None:
    """The base file must come from this vocabulary and (if -c was given) this context."""
    if base.n_vocab != n_vocab:
        raise PerplexityError(f"{base.path}: made with a vocabulary of {base.n_vocab} tokens, "
                              f"but the model has {n_vocab} (inconsistent vocabulary)")
    if n_ctx is not None and n_ctx != base.n_ctx:
        raise PerplexityError(f"{base.path}: made with a context of {base.n_ctx} tokens, but -c is {n_ctx}; "
                              f"drop -c or pass -c {base.n_ctx}")
    if base.n_ctx > n_ctx_train:
        raise PerplexityError(f"{base.path}: its context of {base.n_ctx} is over the model's trained "
                              f"context length {n_ctx_train}")
    lo, hi = int(base.tokens.min()), int(base.tokens.max())
    if lo < 0 or hi >= n_vocab:
        raise PerplexityError(f"{base.path}: token id {lo if lo < 0 else hi} is outside the vocabulary [0, {n_vocab})")


def kl_divergence(runner, base: LogitsFile, n_chunks: int, bos: int | None, log: Log | None = None,
                  on_chunk: Callable[[int, str], None] | None = None, state: ChunkState | None = None,
                  check: Callable[[], None] = lambda: None) -> KLDResult:
    """Evaluate the base file's chunks and compare with its log-probs, chunk by chunk. ``state``: as
    for ``perplexity``."""
    n_ctx = base.n_ctx
    n_chunk = count_chunks(base.n_chunk * n_ctx, n_ctx, n_chunks)
    first = n_ctx // 2
    tokens = np.asarray(base.tokens)
    res = KLDResult(KLDSums(), n_ctx, n_chunk)

    def apply(i: int, rec: dict) -> str:
        res.sums.merge(KLDSums.from_record(rec))
        return res.chunk_line(i + 1)

    done = _replay(state, apply, on_chunk)

    def chunk(i: int, logits: np.ndarray) -> None:
        c = kld_chunk(logits, np.asarray(base.log_probs[i]), chunk_targets(tokens, i, n_ctx))
        if state is not None:
            state.append(c.to_record())
        res.sums.merge(c)
        if on_chunk:
            on_chunk(i, res.chunk_line(i + 1))

    times = run_chunks(runner, tokens, n_ctx, n_chunk, bos, np.arange(first, n_ctx - 1), chunk, start=done,
                       log=log, check=check, name="perplexity")
    res.seconds, res.first_pass_s = times.seconds, times.first_pass_s
    return res
