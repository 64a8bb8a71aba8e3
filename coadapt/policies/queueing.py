"""Latency of replicas behind one gateway: M/M/1 and pooled M/M/c (Erlang C), pure math.

The live gateway routes each request to the ready replica with the fewest outstanding
requests, which behaves like one queue served by ``c`` replicas (M/M/c, FCFS), not like
``c`` separate queues. The SLO autoscaler fits a replica's service rate ``mu`` through this
model and sizes deployments with it; the serving simulator draws its latencies from it. One
copy, here, because policies must not import the simulator.

Every function takes the per-replica service rate ``mu`` (requests/s), the number of
replicas ``c`` and the *total* offered load ``total_rps`` of the pool. With ``c = 1`` the
pooled model is exactly the M/M/1 one: latency exponential with rate ``mu - load``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = [
    "erlang_c",
    "mm1_quantile",
    "pooled_beyond",
    "pooled_capacity",
    "pooled_quantile",
    "replicas_for",
    "service_rate_for",
    "tail_factor",
]


def tail_factor(q: float) -> float:
    """ln(1/(1-q)): an exponential's q-quantile times its rate (4.6 for p99)."""
    return math.log(1.0 / (1.0 - q))


def mm1_quantile(mu: float, load_rps: float, q: float) -> float:
    """The q-quantile latency of one M/M/1 replica at ``load_rps`` (inf at saturation)."""
    slack = mu - load_rps
    return math.inf if slack <= 0 else tail_factor(q) / slack


def erlang_c(c: int, offered: float) -> float:
    """The chance a request waits in M/M/c with ``offered`` = total_rps / mu Erlangs."""
    if c <= 0 or offered >= c:
        return 1.0
    if offered <= 0:
        return 0.0
    b = 1.0  # Erlang B by its stable recursion, then Erlang C
    for k in range(1, c + 1):
        b = offered * b / (k + offered * b)
    return b / (1.0 - (offered / c) * (1.0 - b))


def pooled_beyond(mu: float, c: int, total_rps: float, t: float) -> float:
    """P(latency > t) when ``c`` replicas of rate ``mu`` serve ``total_rps`` from one queue."""
    c = int(c)
    if c <= 0 or mu <= 0 or total_rps >= c * mu:
        return 1.0
    if t <= 0:
        return 1.0
    if total_rps <= 0:
        return math.exp(-mu * t)
    wait = erlang_c(c, total_rps / mu)
    theta = c * mu - total_rps  # the wait's rate, given that it waits
    if abs(theta - mu) < 1e-9 * mu:
        both = (1.0 + mu * t) * math.exp(-mu * t)
    else:
        both = (theta * math.exp(-mu * t) - mu * math.exp(-theta * t)) / (theta - mu)
    return min(max((1.0 - wait) * math.exp(-mu * t) + wait * both, 0.0), 1.0)


def _bisect(
    below: Callable[[float], bool], lo: float, hi: float, steps: int, *, geometric: bool = False
) -> tuple[float, float]:
    """The final bracket ``(lo, hi)`` around where the monotone ``below`` turns False:
    ``below(lo)`` holds, ``hi`` is doubled until ``below(hi)`` fails, then ``steps`` halvings
    (of the ratio when ``geometric``, for a root that spans decades)."""
    while below(hi):
        lo, hi = hi, 2.0 * hi
    for _ in range(steps):
        mid = math.sqrt(lo * hi) if geometric else 0.5 * (lo + hi)
        if below(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def pooled_quantile(mu: float, c: int, total_rps: float, q: float) -> float:
    """The q-quantile latency of :func:`pooled_beyond` (inf at or past saturation)."""
    if c <= 0 or mu <= 0 or total_rps >= c * mu:
        return math.inf
    _, hi = _bisect(lambda t: pooled_beyond(mu, c, total_rps, t) > 1.0 - q, 0.0, 1.0 / mu, 60)
    return hi


def pooled_capacity(mu: float, c: int, slo_s: float, q: float) -> float:
    """The most total requests/s ``c`` pooled replicas serve with the q-quantile <= ``slo_s``
    (0 when even an idle replica misses: ``mu * slo_s < ln(1/(1-q))``)."""
    if c <= 0 or pooled_beyond(mu, c, 0.0, slo_s) > 1.0 - q:
        return 0.0
    # c * mu saturates the pool, so the bracket needs no widening.
    lo, _ = _bisect(lambda rps: pooled_beyond(mu, c, rps, slo_s) <= 1.0 - q, 0.0, c * mu, 50)
    return lo


def replicas_for(mu: float, total_rps: float, slo_s: float, q: float, most: int) -> int:
    """The least ``c`` (at most ``most``) whose pooled q-quantile at ``total_rps`` is within
    ``slo_s``; ``most`` when none is. Pooling lets ``c`` fall below ``ceil(load / capacity)``
    of separate replicas: the larger the pool, the closer each replica runs to ``mu``."""
    if total_rps <= 0:
        return 0
    c = max(1, math.floor(total_rps / mu))
    while c < most and pooled_beyond(mu, c, total_rps, slo_s) > 1.0 - q:
        c += 1
    return min(c, most)


def service_rate_for(c: int, total_rps: float, latency_s: float, q: float) -> float:
    """The per-replica ``mu`` at which ``c`` pooled replicas serving ``total_rps`` have the
    q-quantile latency ``latency_s``: one observation inverted (the quantile falls as ``mu``
    rises, so bisection on log ``mu`` finds the one root)."""
    if c <= 0 or not (latency_s > 0 and math.isfinite(latency_s)) or total_rps < 0:
        raise ValueError(
            f"service_rate_for: c = {c!r}, total_rps = {total_rps!r}, latency_s = "
            f"{latency_s!r}; accepted: c >= 1, total_rps >= 0, finite latency_s > 0"
        )
    target = 1.0 - q
    lo = max(total_rps / c, 1e-12)  # saturated: P(latency > t) = 1 > target
    hi = max(2.0 * lo, tail_factor(q) / latency_s)
    lo, hi = _bisect(  # 48 halvings: relative precision ~1e-12 for a bracket within 2x
        lambda m: pooled_beyond(m, c, total_rps, latency_s) > target, lo, hi, 48, geometric=True
    )
    return math.sqrt(lo * hi)
