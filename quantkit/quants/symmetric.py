"""The symmetric family -- one scale per block, no minimum -- under its earlier module name, for imports
that use it: Q4_0, Q5_0, Q8_0 live in quants/legacy.py, Q3_K, Q6_K, Q8_K in quants/kquants.py and the
family's scale searches (``make_qx_quants``, ``make_q3_quants``) in quants/search.py."""

from quantkit.quants.kquants import Q3_K, Q6_K, Q8_K
from quantkit.quants.legacy import Q4_0, Q5_0, Q8_0
from quantkit.quants.search import make_q3_quants, make_q3_quants_lanes, make_qx_quants, make_qx_quants_lanes

__all__ = ["Q3_K", "Q4_0", "Q5_0", "Q6_K", "Q8_0", "Q8_K", "make_q3_quants", "make_q3_quants_lanes",
           "make_qx_quants", "make_qx_quants_lanes"]
