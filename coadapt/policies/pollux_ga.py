"""The paper's genetic algorithm for FITNESS_p (``pollux-ga``), kept as a reference.

Pollux searches allocation matrices with an evolutionary algorithm (NSGA-II in the artifact,
whose selection uses FITNESS_p as the objective that picks the result): a population of 100
matrices evolves for 100 generations; each generation applies single-point crossover over jobs,
mutations that reset a job to its current allocation, zero out some of its GPUs or add GPUs
where nodes have room, and a repair step that restores feasibility; survivors are the fittest
of parents and children. The population carries over between rounds (adapted to the jobs and
nodes still present): the decision's state holds it (``population``, ``jobs``, ``nodes``) as
JSON lists. All randomness comes from the generator passed to :meth:`PolluxGAPolicy.optimize`.
"""

from __future__ import annotations

import numpy as np

from coadapt.policies.base import BatchMode, ClusterSnapshot, Decision, PolicyState
from coadapt.policies.pollux_problem import IntArray, PolluxProblem


class PolluxGAPolicy:
    """Pollux with the paper's genetic algorithm (slow; for comparison)."""

    name = "pollux-ga"
    batch_mode = BatchMode.ADAPTIVE

    def __init__(
        self,
        p: float = -1.0,
        epsilon: float = 1e-3,
        avoid_interference: bool = True,
        population: int = 100,
        generations: int = 100,
    ) -> None:
        self.p = p
        self.epsilon = epsilon
        self.avoid_interference = avoid_interference
        self.population = population
        self.generations = generations

    @staticmethod
    def _initial(problem: PolluxProblem, snapshot: ClusterSnapshot, state: PolicyState) -> IntArray:
        base = problem.base[None]
        if not state.get("population"):
            return base
        jobs = problem.names
        nodes = [n.name for n in snapshot.nodes]
        prev_jobs, prev_nodes = list(state["jobs"]), list(state["nodes"])
        prev = np.asarray(state["population"], dtype=np.int64).reshape(
            -1, len(prev_jobs), len(prev_nodes)
        )
        states = np.zeros((prev.shape[0], len(jobs), len(nodes)), dtype=np.int64)
        job_src = {name: i for i, name in enumerate(prev_jobs)}
        node_src = {name: i for i, name in enumerate(prev_nodes)}
        for j, name in enumerate(jobs):
            if name not in job_src:
                continue
            for n, node in enumerate(nodes):
                if node in node_src:
                    states[:, j, n] = prev[:, job_src[name], node_src[node]]
        return np.concatenate([base, problem.repair(states)], axis=0)

    def optimize(
        self, snapshot: ClusterSnapshot, state: PolicyState, rng: np.random.Generator
    ) -> Decision:
        """Evolve the carried-over population; ``diagnostics["fitness"]`` is the best FITNESS_p."""
        problem = PolluxProblem(snapshot, self.p, self.epsilon, self.avoid_interference)
        if problem.num_jobs == 0 or problem.num_nodes == 0:
            return Decision({}, dict(state))
        pop = self._initial(problem, snapshot, state)
        if pop.shape[0] < self.population:  # fill up with mutants of what we have
            extra = pop[rng.integers(pop.shape[0], size=self.population - pop.shape[0])]
            pop = np.concatenate([pop, problem.repair(self._mutate(problem, extra, rng))])
        fit = problem.fitness(pop)
        for _ in range(self.generations):
            children = self._offspring(problem, pop, fit, rng)
            child_fit = problem.fitness(children)
            allpop = np.concatenate([pop, children])
            allfit = np.concatenate([fit, child_fit])
            keep = np.argsort(-allfit, kind="stable")[: self.population]
            pop, fit = allpop[keep], allfit[keep]
        best = int(np.argmax(fit))
        new_state: PolicyState = {
            "population": pop.tolist(),
            "jobs": list(problem.names),
            "nodes": [n.name for n in snapshot.nodes],
        }
        return Decision(problem.to_allocations(pop[best]), new_state, {"fitness": float(fit[best])})

    def _offspring(
        self, problem: PolluxProblem, pop: IntArray, fit: np.ndarray, rng: np.random.Generator
    ) -> IntArray:
        size, jobs = pop.shape[0], pop.shape[1]
        # Binary tournament selection of parent pairs.
        a, b = rng.integers(size, size=(2, size))
        first = np.where(fit[a] >= fit[b], a, b)
        a, b = rng.integers(size, size=(2, size))
        second = np.where(fit[a] >= fit[b], a, b)
        # Single-point crossover over jobs.
        points = rng.integers(jobs + 1, size=size)
        mask = np.arange(jobs)[None, :] < points[:, None]
        children = np.where(mask[:, :, None], pop[first], pop[second])
        return problem.repair(self._mutate(problem, children, rng))

    @staticmethod
    def _mutate(problem: PolluxProblem, states: IntArray, rng: np.random.Generator) -> IntArray:
        states = states.copy()
        size, jobs, _nodes = states.shape
        # (1) reset some jobs to their current allocation
        reset = rng.random((size, jobs)) < 0.1
        states = np.where(reset[:, :, None], problem.base[None], states)
        # (2) zero out some elements of some jobs
        prob = np.where(rng.random((size, jobs)) < 0.1, 0.1, 0.0)
        states[rng.random(states.shape) < prob[:, :, None]] = 0
        # (3) raise some elements where the node has room, favouring nodes the job uses
        free = problem.node_caps[None, :] - states.sum(axis=1)  # (P, N)
        room = free[:, None, :] > 0
        p1 = room / np.maximum(room.sum(axis=2, keepdims=True), 1)
        used = room & (states > 0)
        p2 = used / np.maximum(used.sum(axis=2, keepdims=True), 1)
        hit = rng.random(states.shape) < p1 + p2 - p1 * p2
        upper = np.minimum(states + free[:, None, :], problem.node_caps[None, None, :])
        raised = states + np.floor(rng.random(states.shape) * (upper - states + 1)).astype(np.int64)
        states[hit] = raised[hit]
        return states
