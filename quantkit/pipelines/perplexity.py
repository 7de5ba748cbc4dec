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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from quantkit.errors import FormatError, ModelError, QuantkitError
from quantkit.formats.logits import LogitsFile, LogitsWriter, n_vocab_padded
from quantkit.jit import njit_fast_parallel, prange
from quantkit.model.decode import expf, max_f32


class PerplexityError(QuantkitError):
    """A request the perplexity or imatrix tools cannot serve (too little text, mismatched base file)."""


# -- input text --------------------------------------------------------------------------------

def read_text(path: str | os.PathLike | None, builtin: str) -> tuple[str, str]:
    """``(text, dataset name)``. ``path`` None: the built-in ``builtin`` half ("calibration" or
    "evaluation") of quantkit.formats.texts. A file must be UTF-8; as llama.cpp's ``-f``, one trailing
    newline is dropped."""
    if path is None:
        from quantkit.formats.texts import calibration_texts, text_sha256

        cal, ev = calibration_texts()
        text = cal if builtin == "calibration" else ev
        return text, f"pydoc_data.topics:{builtin}:sha256={text_sha256(text)[:16]}"
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise PerplexityError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise PerplexityError(f"{p}: is a directory, not a text file") from None
    except OSError as e:
        raise PerplexityError(f"{p}: cannot read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PerplexityError(f"{p}: not UTF-8 text (invalid byte at offset {e.start})") from None
    if text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise PerplexityError(f"{p}: the file is empty")
    return text, str(path)


def tokenize(tok, text: str, n_ctx: int, where: str, parse_special: bool = False) -> np.ndarray:
    """The text's token ids (BOS first when the vocab adds it); at least ``2*n_ctx`` of them."""
    ids = np.asarray(tok.encode(text, add_special=True, parse_special=parse_special), dtype=np.int32)
    if ids.size < 2 * n_ctx:
        raise PerplexityError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; "
                              f"{where} tokenizes to only {ids.size} tokens")
    return ids


def check_batch(n_ctx: int, n_batch: int) -> int:
    """llama.cpp's chunks-per-batch ``n_seq = max(1, n_batch / n_ctx)``; the batch must be below the
    context or a multiple of it (the reference asserts this)."""
    if n_ctx <= 0:
        raise PerplexityError(f"the context size must be positive, got {n_ctx}")
    if n_batch <= 0:
        raise PerplexityError(f"the batch size must be positive, got {n_batch}")
    if not (n_batch < n_ctx or n_batch % n_ctx == 0):
        raise PerplexityError(f"batch size {n_batch} must be smaller than the context ({n_ctx}) or a multiple of it")
    return max(1, n_batch // n_ctx)


def ubatch(n_batch: int) -> int:
    """Rows per forward pass: llama.cpp's micro-batch, ``min(n_ubatch = 512, n_batch)``."""
    return min(512, n_batch)


def chunk_input(tokens: np.ndarray, i: int, n_ctx: int, bos: int | None) -> np.ndarray:
    """Tokens of chunk i with the first one replaced by BOS when the vocab adds BOS."""
    x = np.array(tokens[i * n_ctx:(i + 1) * n_ctx], dtype=np.int64)
    if bos is not None:
        x[0] = bos
    return x


def add_bos_id(tok) -> int | None:
    """``llama_vocab_get_add_bos`` ? BOS : None."""
    return tok.bos_id if tok.add_bos else None


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
        self.nll += float(nll.sum())
        self.nll2 += float((nll * nll).sum())
        self.count += int(nll.size)
        self.running.append(self.ppl)
        return self.ppl

    def final_line(self) -> str:
        err = self.ppl_err
        if math.isnan(err):
            return "Unexpected negative standard deviation of log(prob)"
        return f"Final estimate: PPL = {self.ppl:.4f} +/- {err:.5f}"


Log = Callable[[str], None]


def _eta_line(t_pass: float, n_chunk: int) -> str:
    total = int(t_pass * n_chunk)
    s = f"{t_pass:.2f} seconds per pass - ETA "
    if total >= 3600:
        s += f"{total // 3600} hours "
        total %= 3600
    return s + f"{total / 60.0:.2f} minutes"


def perplexity(runner, tokens: np.ndarray, n_ctx: int, n_chunks: int, bos: int | None,
               base_out: str | os.PathLike | None = None, log: Log | None = None,
               on_chunk: Callable[[int, float], None] | None = None) -> PerplexityResult:
    """Run the chunks and score their second halves. ``base_out``: also write the KL base file."""
    n_vocab = runner.config.n_vocab
    n_chunk_max = tokens.size // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    if n_chunk <= 0:
        raise PerplexityError("no chunk to evaluate (--chunks 0)")
    first = n_ctx // 2
    res = PerplexityResult(n_ctx, n_chunk)
    writer = LogitsWriter(base_out, n_ctx, n_vocab, n_chunk, tokens).open() if base_out else None
    t0 = time.perf_counter()
    try:
        for i in range(n_chunk):
            tc = time.perf_counter()
            x = chunk_input(tokens, i, n_ctx, bos)
            runner.reset()
            logits = runner.forward(x, 0, logits=np.arange(first, n_ctx - 1))     # (n_scored, n_vocab)
            targets = tokens[i * n_ctx + first + 1:(i + 1) * n_ctx].astype(np.int64)
            if writer is not None:
                q, nll = quantize_log_probs(logits, targets)
                writer.write_chunk(q)
            else:
                nll = nll_rows(logits, targets)
            ppl = res.add(nll)
            if i == 0:
                res.first_pass_s = time.perf_counter() - tc
                if log:
                    log(_eta_line(res.first_pass_s, n_chunk))
            if on_chunk:
                on_chunk(i, ppl)
        if writer is not None:
            writer.commit()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    res.seconds = time.perf_counter() - t0
    return res


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
                  on_chunk: Callable[[int, str], None] | None = None) -> KLDResult:
    """Evaluate the base file's chunks and compare with its log-probs, chunk by chunk."""
    n_ctx = base.n_ctx
    n_chunk = base.n_chunk if n_chunks < 0 else min(n_chunks, base.n_chunk)
    if n_chunk <= 0:
        raise PerplexityError("no chunk to evaluate (--chunks 0)")
    first = n_ctx // 2
    tokens = np.asarray(base.tokens)
    res = KLDResult(KLDSums(), n_ctx, n_chunk)
    t0 = time.perf_counter()
    for i in range(n_chunk):
        tc = time.perf_counter()
        x = chunk_input(tokens, i, n_ctx, bos)
        runner.reset()
        logits = runner.forward(x, 0, logits=np.arange(first, n_ctx - 1))
        targets = tokens[i * n_ctx + first + 1:(i + 1) * n_ctx].astype(np.int64)
        kld_rows(logits, np.asarray(base.log_probs[i]), targets, res.sums)
        if i == 0:
            res.first_pass_s = time.perf_counter() - tc
            if log:
                log(_eta_line(res.first_pass_s, n_chunk))
        if on_chunk:
            on_chunk(i, res.chunk_line(i + 1))
    res.seconds = time.perf_counter() - t0
    return res


def open_model(path, n_ctx: int, n_batch: int):
    """(model, tokenizer, runner) for a llama GGUF, with a KV cache of ``n_ctx`` positions."""
    from quantkit.formats.locate import bundled_model
    from quantkit.model.forward import Runner
    from quantkit.model.llama import Llama
    from quantkit.model.tokenizer import Tokenizer

    model = Llama(path or bundled_model())
    try:
        if n_ctx > model.config.n_ctx_train:
            raise ModelError(f"{model.path}: context size {n_ctx} is over the model's trained context length "
                             f"{model.config.n_ctx_train}")
        tok = Tokenizer.from_metadata(model.metadata)
        if tok.add_eos:
            raise ModelError(f"{model.path}: the vocabulary adds EOS to every text; perplexity needs it not to")
        if tok.n_vocab != model.config.n_vocab:
            raise FormatError(f"{model.path}: the tokenizer has {tok.n_vocab} tokens but the model "
                              f"{model.config.n_vocab}")
        # passes of many rows never run the one-token decode step: skip building it (its compiled
        # kernel and its huge-page copy of the weights cost ~1 s and the weights' size in memory)
        runner = Runner(model, n_ctx, ubatch(n_batch), compiled_step=ubatch(n_batch) == 1)
    except BaseException:
        model.close()
        raise
    return model, tok, runner
