"""Eq. 14's batch choice for many queries in one compiled pass (numba), the numpy path's choice.

Why: a 2048-GPU round on three GPU types asks ~62k (job, shape) queries, each tried at
``BATCH_CANDIDATES`` batch sizes. The numpy path builds ~20 temporaries of candidates x queries
and evaluates three ``pow`` per candidate; most of them repeat. Here one loop per query keeps
everything in registers and evaluates each repeated ``pow`` once:

* ``ts ** gamma`` is one per query (the synchronisation time does not depend on the batch);
* ``tg ** gamma`` depends only on the job's θ_sys and the integer micro-batch, so it is kept in
  a table per job (queries come job after job; a change of θ_sys starts a new table);
* the candidate grid ``lo * (hi / lo) ** frac`` is one per (lo, hi), which most of a job's
  queries share (``lo`` grows with the GPU count only past ``M0 / min_local`` GPUs).

Same arithmetic in the same order as :func:`coadapt.goodput.model._optimize_slice`, so the
choices are identical and the goodputs too, bit for bit, where numpy's ``pow`` is the C
library's. On AVX-512 CPUs numpy evaluates ``pow`` with SIMD code that may round the last bit
differently (<= 2 ulp seen), so there goodputs agree to the last bits (tested element by
element); ``None`` without numba.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from coadapt._jit import kernel

#: Largest micro-batch whose ``tg ** gamma`` is tabled (larger ones are computed each time).
TABLE_SIZE = 1 << 14


def _choose(  # type: ignore[no-untyped-def]
    perf, sqr, var, m0s, min_locals, upper_locals, max_batches, accumulation, pinned_batch,
    accumulate_to_measure, nodes, replicas_in, frac, eps, good_out, atomic_out, accum_out,
):  # fmt: skip
    q_count = replicas_in.size
    c_count = frac.size
    grid = np.empty(c_count)
    table = np.empty(TABLE_SIZE)
    stamp = np.zeros(TABLE_SIZE, dtype=np.int64)
    generation = 0
    last_ag = last_bg = last_gamma = math.nan
    last_lo = last_hi = math.nan
    for q in range(q_count):
        ag = perf[0, q]
        bg = perf[1, q]
        al = perf[2, q]
        bl = perf[3, q]
        an = perf[4, q]
        bn = perf[5, q]
        gamma = perf[6, q]
        if not (ag == last_ag and bg == last_bg and gamma == last_gamma):
            generation += 1
            last_ag, last_bg, last_gamma = ag, bg, gamma
        live = replicas_in[q] > 0
        replicas = float(max(replicas_in[q], 1))
        m0 = m0s[q]
        min_local = min_locals[q]
        upper_local = upper_locals[q]
        max_batch = max_batches[q]
        pinned = pinned_batch[q] > 0
        lo = max(m0, min_local * replicas)
        hi = max(max_batch, lo)
        if not (lo == last_lo and hi == last_hi):
            ratio = hi / lo
            for c in range(c_count):
                grid[c] = lo * ratio ** frac[c]
            last_lo, last_hi = lo, hi
        retro = max(replicas - 2.0, 0.0)
        if nodes[q] > 1:
            ts = an + bn * retro
        elif replicas > 1:
            ts = al + bl * retro
        else:
            ts = 0.0
        ts_g = ts**gamma
        inv_gamma = 1.0 / gamma
        s2 = sqr[q]
        v2 = var[q]
        best_good = 0.0
        best_atomic = 0.0
        best_accum = 0.0
        for c in range(c_count):
            batch = pinned_batch[q] if pinned else grid[c]
            local = batch / replicas
            accum = np.ceil(local / upper_local - eps) - 1.0
            if replicas == 1.0 and local > m0 + eps and accumulate_to_measure[q]:
                accum = max(accum, 1.0)
            accum = max(accum, 0.0) if accumulation[q] else 0.0
            atomic = np.ceil(local / (accum + 1.0) - eps)
            tg = ag + bg * atomic
            if 0.0 <= atomic < TABLE_SIZE:
                slot = int(atomic)
                if stamp[slot] != generation:
                    table[slot] = tg**gamma
                    stamp[slot] = generation
                tg_g = table[slot]
            else:
                tg_g = tg**gamma
            t_iter = accum * tg + (tg_g + ts_g) ** inv_gamma
            total = replicas * atomic * (accum + 1.0)
            scale = total / m0
            denom = v2 / scale + s2
            gain = (v2 + s2) / denom if denom > 0 else 1.0
            good = total / t_iter * gain / scale
            feasible = atomic <= upper_local and live
            if pinned:
                feasible = feasible and atomic >= 1
            else:
                feasible = feasible and atomic >= min_local and batch <= max_batch + eps
            if not feasible:
                good = 0.0
            # np.argmax: the first maximum, or the first NaN if there is one.
            if c == 0 or good > best_good or (math.isnan(good) and not math.isnan(best_good)):
                best_good, best_atomic, best_accum = good, atomic, accum
                if math.isnan(good):
                    break
        good_out[q] = best_good
        atomic_out[q] = int(best_atomic)
        accum_out[q] = int(best_accum)


@cache
def compiled() -> Any | None:
    """The compiled kernel, built on first use (importing numba only where a policy prices
    batches, never in a training replica); None without numba."""
    return kernel()(_choose)
