"""The round-latency fast paths of ``pollux`` give exactly what the plain code gave: growth
plans and where they stop, count tables (cached per problem while its pricing is unchanged),
one-state speedups and the search's matrix-wide row statistics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from coadapt.policies.base import JobInfo
from coadapt.policies.pollux import _choose_counts, _CountRows, _Search
from coadapt.policies.pollux_problem import PolluxProblem
from coadapt.policies.pollux_types import _on_type
from tests.policies.builders import random_model, random_snapshot


def _may_spread(s: _Search, j: int, n: int) -> bool:
    """Node n lets job j be distributed over it (the per-node check of the plain code)."""
    return not s.pb.avoid_interference or int(s.dist_owner[n]) in (-1, j)


def _reference_grow_plan(s: _Search, j: int, extra: int) -> tuple[tuple[int, int], ...] | None:
    """The growth plan as a Python loop over nodes (the code before the vectorised one)."""
    row = s.state[j]
    own = np.flatnonzero(row > 0)
    plan: dict[int, int] = {}
    need = extra
    if own.size == 0:
        fits = np.flatnonzero(s.free >= extra)
        if fits.size:
            n = int(fits[np.argmin(s.free[fits])])
            return ((n, extra),)
    else:
        for n in own[np.argsort(-s.free[own], kind="stable")]:
            take = int(min(s.free[n], need))
            if take > 0:
                plan[int(n)] = take
                need -= take
            if need == 0:
                return tuple(plan.items())
        if not all(_may_spread(s, j, int(n)) for n in own):
            return None
    for n in [int(n) for n in np.argsort(-s.free, kind="stable") if s.free[n] > 0 and row[n] == 0]:
        if not _may_spread(s, j, n):
            continue
        take = int(min(s.free[n], need))
        plan[n] = plan.get(n, 0) + take
        need -= take
        if need == 0:
            return tuple(plan.items())
    return None


@pytest.mark.parametrize("seed", range(6))
def test_growth_plans_match_the_node_loop(seed: int) -> None:
    snap = random_snapshot(seed, num_nodes=12, num_jobs=18)
    pb = PolluxProblem(snap)
    s = _Search(pb, pb.base)
    rng = np.random.default_rng(seed)
    for _ in range(60):  # random partial states: grow jobs by random amounts, compare, apply
        j = int(rng.integers(pb.num_jobs))
        extra = int(rng.integers(1, 9))
        got, want = s._grow_plan(j, extra), _reference_grow_plan(s, j, extra)
        assert got == want
        if got is not None and rng.random() < 0.5:
            move = s.best_growth(j)
            if move is not None:
                s.apply(move)


@pytest.mark.parametrize("seed", range(6))
def test_reach_is_exactly_where_growth_plans_stop(seed: int) -> None:
    """best_growth skips sizes above ``_reach``: each of those must be one _grow_plan refuses,
    and each size at or below it one it places (so no decision changes), on crowded states
    where free GPUs sit on other distributed jobs' nodes."""
    snap = random_snapshot(seed, num_nodes=12, num_jobs=18)
    pb = PolluxProblem(snap)
    s = _Search(pb, pb.base)
    rng = np.random.default_rng(seed)
    refused = placed = 0
    for _ in range(80):
        j = int(rng.integers(pb.num_jobs))
        reach = s._reach(j)
        for extra in range(1, int(s.free.sum()) + 2):
            plan = s._grow_plan(j, extra)
            assert (plan is None) == (extra > reach), (j, extra, reach)
            refused += plan is None
            placed += plan is not None
        move = s.best_growth(j)
        if move is not None:
            s.apply(move)
    assert refused and placed


@pytest.mark.parametrize("seed", range(6))
def test_matrix_wide_row_statistics_equal_the_per_row_code(seed: int) -> None:
    """The search's utilities, shrink options and growth estimates taken matrix-wide are the
    per-row methods' values exactly, as jobs grow, shrink and return to their allocations."""
    snap = random_snapshot(seed, num_nodes=12, num_jobs=18)
    pb = PolluxProblem(snap)
    s = _Search(pb, pb.base, floor=seed % 2)
    rng = np.random.default_rng(seed)
    for _ in range(25):
        fresh = _Search(pb, s.state, floor=s.floor)
        want_util = [s._row_utility(j, s.state[j]) for j in range(pb.num_jobs)]
        assert fresh.util.tolist() == want_util
        assert s._shrink_options() == [s._shrink_option(j) for j in range(pb.num_jobs)]
        want = [s._grow_estimate(j) for j in range(pb.num_jobs)]
        assert s._grow_estimates().tolist() == want
        j = int(rng.integers(pb.num_jobs))
        if rng.random() < 0.6:
            move = s.best_growth(j)
            if move is not None:
                s.apply(move)
        elif s.k[j] > 0:
            n = int(np.flatnonzero(s.state[j])[0])
            s.state[j, n] -= 1
            s.free[n] += 1
            s._refresh(j)
        if rng.random() < 0.2:
            s.reverts()


def _count_utilities(pb: PolluxProblem) -> list[list[float]]:
    """Every job's whole count row (copies)."""
    rows = _CountRows(pb)
    return [list(rows.upto(j, rows.caps[j])) for j in range(pb.num_jobs)]


def _plan_utility(s: _Search, j: int, plan: tuple[tuple[int, int], ...]) -> float:
    """Job j's utility with ``plan`` added to a copy of its row (the plain code)."""
    row = s.state[j].copy()
    for n, c in plan:
        row[n] += c
    return s._row_utility(j, row)


def test_count_tables_follow_caps_bases_and_pricing() -> None:
    snap = random_snapshot(3, num_nodes=8, num_jobs=10)
    pb = PolluxProblem(snap)
    first = _count_utilities(pb)
    pb.max_replicas[0] = 0  # a solve that keeps job 0 off this type
    pb.base[1] = 0
    second = _count_utilities(pb)
    fresh = PolluxProblem(snap)
    fresh.max_replicas[0] = 0
    fresh.base[1] = 0
    assert second == _count_utilities(fresh) and second[0] == [first[0][0]]
    pb.set_scale(np.full(pb.num_jobs, 0.5))  # new pricing: no stale row may survive
    fresh.set_scale(np.full(pb.num_jobs, 0.5))
    assert _count_utilities(pb) == _count_utilities(fresh) != second


def test_one_state_speedups_equal_the_batched_path() -> None:
    snap = random_snapshot(5, num_nodes=8, num_jobs=14)
    pb = PolluxProblem(snap)
    state = pb.base.copy()
    state[0] = 0
    state[0, 0] = 2
    one = pb.job_speedups(state[None])
    two = pb.job_speedups(np.stack([state, state]))  # P = 2: the per-job array path
    np.testing.assert_array_equal(one[0], two[0])


def _widened(pb: PolluxProblem) -> np.ndarray:
    """The state after the greedy hand-out and five rounds of wide transfers from the base."""
    s = _Search(pb, pb.base)
    s.greedy()
    s.transfers_wide(5)
    return s.state.copy()


@pytest.mark.parametrize("seed", range(6))
def test_wide_transfers_reuse_donor_prices_exactly(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transfers_wide prices each donor's row once a round; pricing it afresh every time (the
    plain code) ends in the same allocation."""
    snap = random_snapshot(seed, num_nodes=6, num_jobs=12)
    pb = PolluxProblem(snap)

    cached = _widened(pb)
    plain = _Search._refresh
    monkeypatch.setattr(_Search, "_refresh", lambda self, j, util=None: plain(self, j))
    np.testing.assert_array_equal(cached, _widened(pb))


@pytest.mark.parametrize("seed", range(8))
def test_no_growth_gains_more_than_its_ceiling(seed: int) -> None:
    """The bound transfers_wide prunes receivers with holds for every job's best growth, on
    states the search reaches (jobs shrunk, grown, moved) and on the current allocation."""
    snap = random_snapshot(seed, num_nodes=6, num_jobs=12)
    pb = PolluxProblem(snap, switch_margin=0.1 * (seed % 2))
    states = [pb.base]
    s = _Search(pb, pb.base)
    s.greedy()
    s.transfers(5)
    states.append(s.state)
    # Running jobs one GPU short of their allocation: regrowing it is "unchanged" (no restart
    # discount), the case the ceiling's factor of at least 1 is for.
    for j in np.flatnonzero(pb.base.sum(axis=1) >= 2).tolist():
        short = pb.base.copy()
        short[j, int(np.argmax(short[j]))] -= 1
        states.append(short)
    checked = 0
    for state in states:
        search = _Search(pb, state)
        free = int(search.free.sum())
        for j in range(pb.num_jobs):
            ceiling = search._gain_ceiling(j, free)
            k = int(search.k[j])
            room = min(int(pb.max_replicas[j]) - k, free)
            start = max(1, int(pb.min_replicas[j]) - k) if k == 0 else 1
            near = min(room, max(pb.gpus_per_node, start))
            # Every size best_growth tries, not just the one it picks.
            for extra in pb.levers.growth_sizes(start, near, room, pb.gpus_per_node):
                plan = search._grow_plan(j, extra)
                if plan is None:
                    continue
                gain = _plan_utility(search, j, plan) - float(search.util[j])
                assert gain <= ceiling + 1e-12 * (1 + abs(ceiling)), (j, extra, gain, ceiling)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("seed", range(8))
def test_wide_transfers_with_and_without_the_ceiling_agree(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transfers_wide skips receivers whose ceiling cannot pay a donor's loss; trying them all
    (the plain code) ends in the same allocation."""
    snap = random_snapshot(100 + seed, num_nodes=8, num_jobs=16)
    pb = PolluxProblem(snap)

    pruned = _widened(pb)
    monkeypatch.setattr(_Search, "_gain_ceiling", lambda self, j, free: float("inf"))
    np.testing.assert_array_equal(pruned, _widened(pb))


def test_a_job_on_one_type_is_the_replaced_job() -> None:
    """type_snapshot's field copy equals dataclasses.replace and leaves the job untouched."""
    rng = np.random.default_rng(3)
    (v100, limits), (k80, _) = random_model(rng), random_model(rng)
    job = JobInfo(
        "j",
        1.0,
        goodput=v100,
        limits=limits,
        gpu_types=("v100", "k80"),
        goodput_by_type={"k80": k80},
        progress=0.25,
    )
    before = replace(job)
    for t in ("v100", "k80", "p100"):
        want = replace(job, goodput=job.goodput_on(t), goodput_by_type=None, gpu_types=None)
        assert _on_type(job, t) == want
    assert job == before


@pytest.mark.parametrize("seed", range(6))
def test_grown_utility_is_the_plan_utility(seed: int) -> None:
    """best_growth prices a plan from the row's statistics; copying the row and pricing it
    (the plain code) gives the same utility, on current, grown and one-GPU-short rows."""
    snap = random_snapshot(seed, num_nodes=8, num_jobs=14)
    pb = PolluxProblem(snap)
    rows = [pb.base]
    for j in np.flatnonzero(pb.base.sum(axis=1) >= 2).tolist():
        short = pb.base.copy()
        short[j, int(np.argmax(short[j]))] -= 1  # regrowing it restores the current row
        rows.append(short)
        # ... and moved: one GPU taken to another node, so regrowing the first node leaves
        # a difference elsewhere.
        moved = short.copy()
        spare = np.flatnonzero((pb.node_caps - moved.sum(axis=0) > 0) & (moved[j] == 0))
        if spare.size:
            moved[j, int(spare[0])] += 1
            rows.append(moved)
    checked = 0
    for state in rows:
        s = _Search(pb, state)
        for j in range(pb.num_jobs):
            spans = int(np.count_nonzero(s.state[j]))
            differ = set(np.flatnonzero(s.state[j] != pb.base[j]).tolist())
            for extra in range(1, 5):
                plan = s._grow_plan(j, extra)
                if plan is None:
                    continue
                assert s._grown_utility(j, plan, spans, differ) == _plan_utility(s, j, plan)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("admission", ["fitness", "las"])
@pytest.mark.parametrize("seed", range(6))
def test_counts_from_rows_computed_as_read_equal_counts_from_whole_rows(
    seed: int, admission: str
) -> None:
    """The count choice computes each job's row only as far as it reads it; with every row
    computed up front (the plain code) it chooses the same counts. Crowded snapshots (more
    jobs than GPUs) leave most entries unread."""
    snap = random_snapshot(200 + seed, num_nodes=4, num_jobs=40)
    pb = PolluxProblem(snap)
    lazy = _CountRows(pb)
    got = _choose_counts(pb, lazy, admission)
    computed = sum(len(row) - 1 for row in lazy.rows)
    whole = _CountRows(PolluxProblem(snap))
    for j in range(pb.num_jobs):
        whole.upto(j, whole.caps[j])
    assert got == _choose_counts(whole.pb, whole, admission)
    assert computed < sum(whole.caps)


@pytest.mark.parametrize("seed", range(8))
def test_remembered_count_steps_choose_what_recomputed_steps_choose(seed: int) -> None:
    """The count choice keeps a job's best step while the free GPUs stay above what the step
    reads; recomputing every step gives the same counts, down to the last free GPU."""
    snap = random_snapshot(300 + seed, num_nodes=3 + 2 * seed, num_jobs=6 + 3 * seed)
    pb = PolluxProblem(snap)
    got = _choose_counts(pb, _CountRows(pb))
    assert got == _choose_counts(pb, _CountRows(pb), remember_steps=False)


def test_idle_terms_follow_the_weights() -> None:
    """The kept utilities at speedup 0 are each job's utility(j, 0), recomputed when the
    weights change (a type's problem is given the round's weights after it is built)."""
    pb = PolluxProblem(random_snapshot(4, num_nodes=4, num_jobs=9))
    assert pb.idle_terms() == [pb.utility(j, 0.0) for j in range(pb.num_jobs)]
    pb.weights = np.linspace(0.5, 2.0, pb.num_jobs)
    assert pb.idle_terms() == [pb.utility(j, 0.0) for j in range(pb.num_jobs)]
