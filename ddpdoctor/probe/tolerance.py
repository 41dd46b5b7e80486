"""How far a distributed result may be from its exact value: bounds derived from the arithmetic
(dtype and number of terms), not constants -- so that 16 ranks summing bfloat16 are judged by what
16 bfloat16 roundings can do, and 2 ranks summing float32 cannot hide an error of 1e-3.

The bounds are Higham's (Accuracy and Stability of Numerical Algorithms, ch. 3-4): with unit
roundoff u = 2**-p (p significand bits, implicit bit included), n roundings of non-negative terms
cost at most a relative gamma_n = n*u / (1 - n*u), whatever order the backend adds them in.

No torch here: the judges run in the parent and in tests.
"""

from __future__ import annotations

import math

# Significand bits, the implicit leading bit included.
_SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
INTEGER_DTYPES = frozenset({"uint8", "int8", "int16", "int32", "int64", "bool"})

# Roundings along one sample's forward and backward path through the probes' two-layer models
# (dot products of 6 and 12 terms each way, the activation and the loss): a first-order count, so
# that a step over the whole batch and the average of per-shard steps may differ by this much per
# sample on top of the summation itself.
STEP_DEPTH = 48


def unit_roundoff(dtype: str) -> float:
    """u for a floating dtype; 0 for integers, whose sums are exact."""
    if dtype in INTEGER_DTYPES:
        return 0.0
    try:
        return 2.0 ** -_SIGNIFICAND_BITS[dtype]
    except KeyError:
        raise ValueError(f"no rounding model for dtype {dtype!r}") from None


def gamma(n: int, u: float) -> float:
    """gamma_n = n*u / (1 - n*u); infinite once n*u >= 1 (no bound left)."""
    if n <= 0 or u == 0.0:
        return 0.0
    if n * u >= 1.0:
        return math.inf
    return n * u / (1.0 - n * u)


def sum_tolerance(dtype: str, terms: int) -> float:
    """Relative bound for a SUM of `terms` non-negative values, each rounded once when it was made
    in `dtype` (one rounding each) and then added in any order (terms - 1 roundings)."""
    return gamma(terms, unit_roundoff(dtype))


def mean_tolerance(dtype: str, terms: int) -> float:
    """As `sum_tolerance`, plus the one rounding of the division that makes the mean."""
    return gamma(terms + 1, unit_roundoff(dtype))


def step_tolerance(
    dtype: str, samples: int, shards: int, lr: float, grad_abs_sum: float, param_abs_max: float
) -> float:
    """Bound on |p_distributed - p_reference| after one SGD step, where one side sums `samples`
    per-sample gradients over the whole batch and the other over `shards` shards and then
    averages the shards (plus the per-sample path's roundings, see STEP_DEPTH).

    `grad_abs_sum` is max over parameter elements of sum_i |dloss_i/dp| (the size the roundings
    are relative to), already including the loss scaling; `param_abs_max` covers the rounding of
    p - lr*g itself on either side.
    """
    u = unit_roundoff(dtype)
    gradient = gamma(samples + shards, u) + gamma(STEP_DEPTH, u)
    return lr * gradient * grad_abs_sum + 2.0 * u * param_abs_max
