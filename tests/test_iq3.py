"""The IQ3 grids and neighbour lists (quantkit.quants.iq3.tables) against their definition in ggml's
``iq3xs_init_impl``, written out the slow way. The bytes they lead to are checked against ggml in
test_golden_lowbit.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from quantkit.quants.iq3 import GRID_IQ3_S, GRID_IQ3_XXS, tables


@pytest.mark.parametrize("name,n,nwant", [("IQ3_XXS", 256, 2), ("IQ3_S", 512, 3)])
def test_neighbours_as_iq3xs_init_impl(name, n, nwant):
    t = tables(name)
    assert t.q.shape == (n, 4) and set(np.unique(t.q)) <= set(range(1, 16, 2))
    on = np.flatnonzero(t.kmap >= 0)
    assert on.size == n and sorted(t.kmap[on]) == list(range(n))
    for u in np.random.default_rng(0).choice(np.flatnonzero(t.kmap < 0), 200, replace=False):
        pos = 2 * ((u >> np.array([0, 3, 6, 9])) & 7) + 1
        d2 = ((t.q.astype(int) - pos) ** 2).sum(axis=1)
        pairs = sorted((int(d), j) for j, d in enumerate(d2))  # qsort on (d2, index)
        want, have, last = [], 0, None
        for d, j in pairs:
            if d != last:
                if have == nwant:
                    break
                have, last = have + 1, d
            want.append(j)
        assert list(t.nbr[t.nstart[u]:t.nstart[u + 1]]) == want, u
    assert all(t.nstart[u] == t.nstart[u + 1] for u in on)


def test_grids_are_gguf_py_s():
    for name, g in (("IQ3_XXS", GRID_IQ3_XXS), ("IQ3_S", GRID_IQ3_S)):
        cls = getattr(gguf.quants, name)
        cls.init_grid()
        assert np.array_equal(g, np.asarray(cls.grid).reshape(cls.grid_shape))
    assert set(np.unique(GRID_IQ3_XXS)) == {4, 12, 20, 28, 36, 44, 52, 62}
