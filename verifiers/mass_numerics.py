"""The one O(V) pass of Traversal / Block Verification: the residual mass of a node's rows.

``residual_mass(p, q, r) = sum_x (p(x) - r q(x))+`` (traversal.py keeps the residual after rejections
in the closed form ``(p - r q)+ / Z(r)``). A compiled loop reads each row once without temporaries;
the sum is accumulated in float64 in a vectorized (re-associated) order, so it differs from a
sequential sum only by rounding (~1e-16 relative). Rows may be float32 or float64.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, fastmath={"reassoc"})
def residual_mass(p, q, r: float) -> float:
    """Z(r) = sum_x (p(x) - r q(x))+ for one node's rows p, q ``[V]``."""
    total = 0.0
    for x in range(p.shape[0]):
        total += max(p[x] - r * q[x], 0.0)
    return total
