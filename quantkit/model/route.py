"""build_moe_ffn's expert routing (src/llama-graph.cpp), written twice over one ``Routing`` record: in
float64 numpy (``route``, the reference's judge) and compiled (``route_token`` for one token, which the
decode step calls per MoE layer and ``route_rows`` calls per row of a batch).

For router logits l (n_expert,) of one token, the router's bias already added:

1. probabilities p by the gating: softmax(l) ("softmax"), sigmoid(l) ("sigmoid", DeepSeek V3, GLM-4.5),
   or l itself ("softmax_weight", gpt-oss: the softmax comes after the choice);
2. selection scores s = p + exp_probs_b (the per-expert score bias of DeepSeek V3, when the layer has
   it), or with ``select_logits`` the logits l themselves (Llama 4); the weights are still read from p;
3. with expert groups (``n_group`` > 1): each group's score is the sum of its two largest s; all but
   the ``n_group_used`` best groups are masked out of s;
4. the ``n_used`` largest s, ties to the lower index (ggml_argsort_top_k: std::sort's insertion sort
   up to 16 elements keeps equal ones in order), in that order, with weights w = p at them;
5. "softmax_weight": w = softmax(w); ``norm_w``: w / sum(w), the sum clamped below at fp16's smallest
   normal 6.103515625e-5; ``w_scale`` (not 0 or 1): w * w_scale.
"""

from __future__ import annotations

import numpy as np

from quantkit.jit import njit, prange, njit_parallel
from quantkit.model.layer import GATINGS, Routing
from quantkit.model.ops import expf, softmax_inplace

#: ``Routing`` as the compiled code reads it: one record (``routing_record``), gating as its GATINGS index
ROUTING_DTYPE = np.dtype([("n_expert", np.int64), ("n_used", np.int64), ("gating", np.int64),
                          ("norm_w", np.int64), ("n_group", np.int64), ("n_group_used", np.int64),
                          ("w_scale", np.float64), ("select_logits", np.int64)])
GATE_SOFTMAX, GATE_SIGMOID, GATE_SOFTMAX_WEIGHT = (GATINGS.index(g) for g in ("softmax", "sigmoid", "softmax_weight"))
#: fp16's smallest normal: the floor of the weights' sum (build_moe_ffn's ggml_clamp)
W_SUM_MIN = 6.103515625e-5


def routing_record(r: Routing | None) -> np.ndarray:
    """(1,) ``ROUTING_DTYPE`` of ``r`` (None: a record of zeros, for a layer without experts)."""
    rec = np.zeros(1, ROUTING_DTYPE)
    if r is not None:
        rec[0] = (r.n_expert, r.n_used, GATINGS.index(r.gating), r.norm_w, r.n_group, r.n_group_used, r.w_scale,
                  r.select_logits)
    return rec


def _group_mask(s: np.ndarray, r: Routing) -> np.ndarray:
    """s (n, n_expert) with the experts of all but each row's ``n_group_used`` best groups at -inf."""
    n = s.shape[0]
    g = s.reshape(n, r.n_group, -1)
    top2 = -np.sort(-g, axis=-1)[:, :, :2].sum(-1)                               # (n, n_group)
    keep = np.argsort(-top2, axis=-1, kind="stable")[:, :r.n_group_used]
    masked = np.full_like(g, -np.inf)
    rows = np.arange(n)[:, None]
    masked[rows, keep] = g[rows, keep]
    return masked.reshape(n, -1)


def route(logits: np.ndarray, r: Routing, score_bias: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64: (experts (n, n_used) int64, weights (n, n_used), margin (n,)) for router logits (n,
    n_expert) (the module's steps). The margin is the n_used-th largest selection score less the next,
    in router-logit units (0 with every expert used), with expert groups the smaller of it and the groups'
    own: how near a token is to another choice."""
    x = np.asarray(logits, np.float64)
    if r.gating == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    elif r.gating == "sigmoid":
        p = 1.0 / (1.0 + np.exp(-x))
    else:
        p = x
    s = x if r.select_logits else p + score_bias if score_bias is not None else p
    if r.n_group > 1:
        s = _group_mask(s, r)
    k = r.n_used
    top = np.argsort(-s, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, top, axis=-1)
    if r.gating == "softmax_weight":
        e = np.exp(w - w.max(axis=-1, keepdims=True))
        w = e / e.sum(axis=-1, keepdims=True)
    if r.norm_w:
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), W_SUM_MIN)
    if r.w_scale not in (0.0, 1.0):
        w = w * r.w_scale
    # the margin in router-logit units: the logits' gap where the choice is a monotone function of them
    # (softmax gating without a score bias: a log-probability gap); a probability scores' gap (sigmoid,
    # or softmax with a score bias) divided by the larger slope p (1 - p) of the two probabilities: to
    # first order, the change of their logits that flips the choice
    on_logits = r.gating == "softmax_weight" or (r.gating == "softmax" and score_bias is None) or r.select_logits
    g = np.where(np.isfinite(s), x, -np.inf) if on_logits and score_bias is None else s
    if k >= s.shape[1]:
        return top, w, np.zeros(s.shape[0])
    order = np.argsort(-g, axis=-1, kind="stable")[:, k - 1:k + 1]
    ga, gb = np.take_along_axis(g, order, axis=-1).T
    with np.errstate(invalid="ignore"):
        margin = ga - gb
    if not on_logits:
        pa, pb = np.take_along_axis(p, order, axis=-1).T
        margin = margin / np.maximum(np.maximum(pa * (1 - pa), pb * (1 - pb)), 1e-6)
    if r.n_group > 1:
        # and the groups' choice: the n_group_used-th best group score less the next, times 2 (a group
        # score is two scores' sum, each moving at most 1/4 of its logit's change)
        p_s = (p + score_bias if score_bias is not None else p).reshape(s.shape[0], r.n_group, -1)
        gs = -np.sort(-(-np.sort(-p_s, axis=-1)[:, :, :2].sum(-1)), axis=-1)
        margin = np.minimum(margin, 2.0 * (gs[:, r.n_group_used - 1] - gs[:, r.n_group_used]))
    return top, w, np.nan_to_num(margin, nan=0.0, posinf=np.inf)


@njit
def _largest(s, n, lo):
    """The index of the largest of s[lo:lo + n] (the first of equal ones), or -1 when all are -inf."""
    best = -1
    for i in range(lo, lo + n):
        if s[i] > -np.inf and (best < 0 or s[i] > s[best]):
            best = i
    return best


@njit
def route_token(logits, score_bias, r, sel, selw, s):
    """One token (the module's steps, float32): ``logits`` (n_expert,) is overwritten by the
    probabilities; the chosen experts into sel[:n_used] and their weights into selw[:n_used];
    ``score_bias`` (n_expert,) or empty; ``r`` a ``ROUTING_DTYPE`` record; ``s`` scratch of at least
    n_expert + n_group float32. Not fastmath: -inf marks the experts taken or masked."""
    n, k = r.n_expert, r.n_used
    if r.select_logits:
        for i in range(n):
            s[i] = logits[i]
    if r.gating == GATE_SOFTMAX:
        softmax_inplace(logits, n)
    elif r.gating == GATE_SIGMOID:
        for i in range(n):
            logits[i] = np.float32(1.0) / (np.float32(1.0) + expf(-logits[i]))
    if not r.select_logits:
        for i in range(n):
            s[i] = logits[i] + score_bias[i] if score_bias.shape[0] else logits[i]
    if r.n_group > 1:
        per = n // r.n_group
        gs = s[n:n + r.n_group]
        for g in range(r.n_group):
            a = _largest(s, per, g * per)
            top = s[a]
            s[a] = -np.inf
            b = _largest(s, per, g * per)
            s[a] = top
            gs[g] = top + s[b] if b >= 0 else top
        for _ in range(r.n_group_used):   # the best groups' scores -> -inf: what is left is masked
            gs[_largest(gs, r.n_group, 0)] = -np.inf
        for g in range(r.n_group):
            if gs[g] > -np.inf:
                for i in range(g * per, (g + 1) * per):
                    s[i] = -np.inf
    for j in range(k):
        best = _largest(s, n, 0)
        sel[j] = best
        selw[j] = logits[best]
        s[best] = -np.inf
    if r.gating == GATE_SOFTMAX_WEIGHT:
        softmax_inplace(selw, k)
    if r.norm_w:
        tot = np.float32(0.0)
        for j in range(k):
            tot += selw[j]
        tot = max(tot, np.float32(W_SUM_MIN))
        for j in range(k):
            selw[j] = selw[j] / tot
    if r.w_scale != 0.0 and r.w_scale != 1.0:
        for j in range(k):
            selw[j] = selw[j] * np.float32(r.w_scale)


@njit_parallel
def _route_rows(logits, score_bias, rec, sel, selw):
    for t in prange(logits.shape[0]):   # (the record is read inside the loop: numba cannot pass one in)
        s = np.empty(rec[0].n_expert + rec[0].n_group, np.float32)
        route_token(logits[t], score_bias, rec[0], sel[t], selw[t], s)


def route_rows(logits: np.ndarray, rec: np.ndarray, score_bias: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """The batch path's routing: ``route_token`` per row of ``logits`` (n, n_expert) float32 (overwritten),
    ``rec`` a (1,) ``routing_record``: (experts (n, n_used) int64, weights (n, n_used) float32)."""
    n, k = logits.shape[0], int(rec[0]["n_used"])
    sel, selw = np.empty((n, k), np.int64), np.empty((n, k), np.float32)
    bias = np.zeros(0, np.float32) if score_bias is None else np.ascontiguousarray(score_bias, np.float32)
    _route_rows(logits, bias, rec, sel, selw)
    return sel, selw
