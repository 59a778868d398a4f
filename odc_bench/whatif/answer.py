"""The verdict's rows: every series at every minibatch size, planned and simulated as
`python -m odc_bench backend=sim` would (the same config composition, plan and simulator).

Bad input ends before anything is written (with one process, before anything is simulated:
all runs are composed and planned first); a run whose per-device memory estimate is over the
device's memory is reported as not fitting (a `backend=sim` run refuses it too) and not
simulated.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace

import pandas as pd

from odc_bench.balancers.quality import stale_lower_bound
from odc_bench.config.compose import COMPOSE_ERRORS, compose_runs, hydra_error_line
from odc_bench.config.run import RunConfig
from odc_bench.data.lengths import dataset_lengths
from odc_bench.data.real import write_pending_caches
from odc_bench.errors import ConfigError
from odc_bench.forked import first_here
from odc_bench.plan.spec import Planner, RunSpec
from odc_bench.record.row import sim_timing
from odc_bench.results.split import per_sample, saving
from odc_bench.sim import check_hardware, simulate
from odc_bench.whatif.question import Question, Series, series

GIB = 2**30

COLUMNS = ["series", "engine", "balancer", "staleness", "minibatch_size", "samples_per_s", "tokens_per_s", "speedup",
           "saved_idle", "saved", "bubble_rate", "unavoidable_bubble_rate", "predicted_bubble_rate", "mem_gib",
           "mem_limit_gib", "fits", "run_id", "overrides"]


def compose_config(overrides: list[str]) -> RunConfig:
    """The typed config `python -m odc_bench OVERRIDES` would run; ConfigError in one line."""
    return compose_configs([overrides])[0]


def compose_configs(runs: list[list[str]]) -> list[RunConfig]:
    """compose_config of each command line, composed together; ConfigError in one line."""
    try:
        return compose_runs(runs)
    except COMPOSE_ERRORS as e:
        raise ConfigError(hydra_error_line(e)) from None


# One run of the verdict: its series, minibatch size, command line and plan.
Run = tuple[Series, int, list[str], RunSpec]


def plan(question: Question) -> list[Run]:
    """Every run of the verdict, planned; ConfigError (nothing simulated or written) for bad input.

    Hydra composes each series once; its other minibatch sizes are the same typed config with
    another `minibatch_size` (the run key and the plans are those of composing it anew, which the
    tests check against `python -m odc_bench`)."""
    every = series(question.all_balancers, question.staleness)
    first = question.minibatch_sizes[0]
    configs = compose_configs([question.run(s, first) for s in every])
    return sorted(_planned(question, list(zip(every, configs, strict=True))), key=_order(every))


def _planned(question: Question, configs: list[tuple[Series, RunConfig]]) -> list[Run]:
    runs = []
    planner = Planner()  # series that share a balancer share its plans
    for s, config in configs:
        for m in question.minibatch_sizes:
            spec = planner.resolve(replace(config, minibatch_size=m))
            if m == question.minibatch_sizes[0]:
                check_hardware(spec)
            runs.append((s, m, question.run(s, m), spec))
    return runs


def _order(every: list[Series]) -> Callable[[Run], tuple[int, int]]:
    """The verdict's order of runs: by minibatch size, the series in their order within each."""
    return lambda run: (run[1], every.index(run[0]))


def verdict(question: Question, workers: int = 0, meanwhile: Callable[[], object] | None = None
            ) -> tuple[list[Run], pd.DataFrame]:
    """plan and answer: every run in the verdict's order, and the verdict's table.

    With `workers`, up to that many processes forked from this one plan and simulate the series,
    those sharing a balancer together (they share its plans), while this one runs `meanwhile` and
    then the first series' share. That series is composed here before anything starts: that
    loads the dataset once (the workers inherit it, and its length cache is written from here)
    and ends most bad input before any worker starts. Bad input still ends before anything is
    written; the rows are those of workers=0 to the bit. With no workers (or one share) `meanwhile`
    does not run."""
    every = series(question.all_balancers, question.staleness)
    groups = list({s.balancer: [t for t in every if t.balancer == s.balancer] for s in every}.values())
    if workers < 1 or len(groups) == 1:
        runs = plan(question)
        return runs, answer(runs)
    first = compose_configs([question.run(every[0], question.minibatch_sizes[0])])[0]
    dataset_lengths(first.dataset, first.seed)
    calls = [(question, groups[0], {every[0]: first}), *[(question, group, {}) for group in groups[1:]]]
    done = first_here(_group_rows, calls, workers, meanwhile)
    order = _order(every)
    pairs = sorted((pair for group in done for pair in group), key=lambda pair: order(pair[0]))
    write_pending_caches()
    return [run for run, _ in pairs], table([r for _, r in pairs])


def _group_rows(question: Question, group: list[Series], composed: dict[Series, RunConfig]
                ) -> list[tuple[Run, dict]]:
    """One share of verdict: its series composed (unless given), planned, then simulated."""
    missing = [s for s in group if s not in composed]
    configs = dict(zip(missing, compose_configs([question.run(s, question.minibatch_sizes[0]) for s in missing]),
                       strict=True))
    runs = _planned(question, [(s, composed.get(s) or configs[s]) for s in group])
    return [(run, row(run)) for run in runs]


def unavoidable(spec: RunSpec, bubble: float) -> float:
    """The bubble the run would keep if its balancer reached every measured minibatch's lower bound
    (balancers/quality.py: an even share of the work or the costliest sample; stale-synchronous, the
    stale bound): the same busy time in its time shrunk by the cost model's bound over its plan's
    prediction. Where the simulator agrees with the cost model this is the bound's own bubble; it is
    never above the run's bubble (which the bound's can be: a simulated run's optimizer step is busy
    time the cost model leaves out), and bubble - unavoidable is the balancer's share."""
    bound = stale_lower_bound([mb.lengths for mb in spec.measured], spec.world_size, spec.max_tokens,
                              spec.cost_model, spec.config.engine.staleness)
    shrink = max(1.0, spec.predicted_time() / bound) if bound > 0 else 1.0
    return max(0.0, 1.0 - (1.0 - bubble) * shrink)


def answer(runs: list[Run]) -> pd.DataFrame:
    """One row per run: predicted throughput, bubbles, memory, and the speedup over the baseline
    series at the same minibatch size."""
    write_pending_caches()  # every run is accepted: real data's lengths may be cached beside it
    return table([row(run) for run in runs])


def row(run: Run) -> dict:
    """A run's own columns, simulated where it fits in memory."""
    s, m, overrides, spec = run
    limit = spec.memory_limit
    fits = limit is None or spec.memory.total <= limit
    out = dict(series=s.label, engine=s.engine, balancer=s.balancer, staleness=s.staleness, minibatch_size=m,
               predicted_bubble_rate=spec.predicted_bubble_rate(), mem_gib=spec.memory.total / GIB,
               mem_limit_gib=limit / GIB if limit is not None else None, fits=fits, run_id=spec.run_id,
               overrides=shlex.join(overrides))
    if fits:
        # As the run's own command writes its row (backend.write_trace=false): from the timeline.
        times = sim_timing(spec, simulate(spec, trace=False))
        out.update({k: v for k, v in times.items()
                    if k in ("samples_per_s", "tokens_per_s", "bubble_rate", "compute_s", "wall_s")})
        out["unavoidable_bubble_rate"] = unavoidable(spec, times["bubble_rate"])
    return out


def table(rows: list[dict]) -> pd.DataFrame:
    """The verdict's table of its runs' rows, in their order: the speedups over the baseline and
    where the time they save comes from."""
    frame = pd.DataFrame(rows)
    parts = per_sample(frame.reindex(columns=["samples_per_s", "bubble_rate", "compute_s", "wall_s"]))
    frame = frame.reindex(columns=COLUMNS)
    base = {r.minibatch_size: i for i, r in frame.iterrows() if Series(r.engine, r.balancer, r.staleness).is_baseline}
    frame["speedup"] = frame.apply(lambda r: r.samples_per_s / frame.samples_per_s[base[r.minibatch_size]]
                                   if r.minibatch_size in base else float("nan"), axis=1)
    # Where the time per sample a series saves against the baseline comes from (idle time: the paper's claim).
    splits = [saving(parts.loc[i], parts.loc[base[r.minibatch_size]]) if r.minibatch_size in base else None
              for i, r in frame.iterrows()]
    frame["saved_idle"] = [s.shares.get("idle", 0.0) if s else float("nan") for s in splits]
    frame["saved"] = [s.describe() if s else "" for s in splits]
    return frame
