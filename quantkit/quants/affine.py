"""The affine family -- a scale and a minimum per block -- under its earlier module name, for imports that
use it: Q4_1, Q5_1 live in quants/legacy.py, Q2_K, Q4_K, Q5_K in quants/kquants.py and the family's
scale searches (``make_qkx2_quants``, ``make_qkx3_quants``, ``make_qp_quants``) in quants/search.py."""

from quantkit.quants.kquants import Q2_K, Q4_K, Q5_K
from quantkit.quants.legacy import Q4_1, Q5_1
from quantkit.quants.search import make_qkx2_quants, make_qkx2_quants_lanes, make_qkx3_quants, make_qp_quants

__all__ = ["Q2_K", "Q4_1", "Q4_K", "Q5_1", "Q5_K", "make_qkx2_quants", "make_qkx2_quants_lanes",
           "make_qkx3_quants", "make_qp_quants"]
