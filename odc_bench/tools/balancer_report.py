"""Predicted plan quality of every balancer on a dataset profile, from cost models alone.

`python -m odc_bench.tools.balancer_report` prints it for the paper's golden setting (LongAlign,
8 ranks, minibatch 4 per rank, max tokens = the longest sample, the 1.5B quadratic cost,
50 minibatches): each balancer's predicted time and bubble rate under collective and ODC
semantics, next to the lower bound and its unavoidable bubble. Minibatches are drawn
exactly as a run draws them (data.lengths.minibatch_samples), so the numbers match the
predicted_bubble_rate column of a run with the same settings and no warm-up.

`--staleness S` adds stale-synchronous ODC (engine.staleness=S): each balancer's plans timed
by balancers/quality.py's StaleClock (LB-Carry planning each minibatch given every rank's
carried-over load), beside the stale lower bound; the last line sets LB-Carry's predicted
bubble against the synchronous per-minibatch lower bound's.

`--plan-cost` plans with a different (wrong) cost model than the one that scores the plans
(`--cost`, the stand-in for the truth): static plans keep their mistakes, while dynamic's
claims are replayed under the true costs (its queue list-scheduled with them), which is
what run-time claiming does. Cost models are written `linear`, `quadratic:1p5b`,
`quadratic:7b`, or the path of a calibration file.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from odc_bench.balancers.cost import QUADRATIC_FITS, CostModel, linear, load_calibration, quadratic
from odc_bench.balancers.dynamic import scheduled
from odc_bench.balancers.quality import (
    SEMANTICS,
    Prediction,
    StaleClock,
    bubble_rate,
    least_work,
    predict,
    rank_work,
    run_bubble_rate,
    stale_bubble_rate,
    stale_clock,
    stale_lower_bound,
)
from odc_bench.balancers.registry import BALANCERS, plan_minibatch
from odc_bench.config.dataset import DatasetConfig
from odc_bench.data.lengths import dataset_lengths, microbatch_limit, minibatch_samples
from odc_bench.data.profiles import PROFILES
from odc_bench.errors import (
    CommandParser,
    ConfigError,
    command_name,
    ends_cleanly,
    fail,
    in_options,
    nonnegative_int,
    positive_float,
    positive_int,
    ratio_at_least_one,
)
from odc_bench.files import readable_file


@dataclass(frozen=True)
class BalancerQuality:
    balancer: str
    semantics: str
    time: float  # summed over minibatches
    bound: float  # summed lower bounds
    bubble_rate: float
    bound_bubble_rate: float
    microbatches_per_rank: float  # mean over ranks and minibatches

    @property
    def over_bound(self) -> float:
        return self.time / self.bound - 1.0


# The run's keys this command sets from its options: an error names the option.
OPTIONS = (("world_size", "--world-size"), ("minibatch_size", "--minibatch-size"),
           ("num_minibatches", "--num-minibatches"), ("dataset.length_scale", "--length-scale"),
           ("packing_ratio", "--packing-ratio"))


def parse_cost(spec: str) -> CostModel:
    """A cost option's argparse type: `linear`, `quadratic:FIT` or a calibration file; anything else
    is refused in one line (an unknown fit was a KeyError's traceback, a missing or damaged file a
    FileNotFoundError's or ValueError's)."""
    if spec == "linear":
        return linear()
    if spec.startswith("quadratic:"):
        fit = spec.split(":", 1)[1]
        if fit not in QUADRATIC_FITS:
            raise argparse.ArgumentTypeError(f"no quadratic fit {fit!r}; choose one of "
                                             f"{', '.join(f'quadratic:{f}' for f in QUADRATIC_FITS)}")
        return quadratic(fit)
    choices = "give linear, quadratic:FIT or a file `python -m odc_bench.calibrate.cost_model` wrote"
    if not spec.strip():
        raise argparse.ArgumentTypeError(f"an empty cost model; {choices}")
    try:
        return load_calibration(readable_file(spec))
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}; {choices}") from None
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def plan_quality(profile: str = "longalign", world_size: int = 8, minibatch_size: int = 4,
                 num_minibatches: int = 50, cost: CostModel | None = None, plan_cost: CostModel | None = None,
                 packing_ratio: float = 1.0, length_scale: float = 1.0, seed: int = 0,
                 staleness: int = 0) -> list[BalancerQuality]:
    """Every balancer's plans scored by `cost` (default quadratic:1p5b), planned with `plan_cost` (default: same);
    with `staleness` > 0 also timed as stale-synchronous ODC (semantics `odc s=N`)."""
    cost = cost or quadratic("1p5b")
    plan_cost = plan_cost or cost
    dataset = DatasetConfig(name=profile, profile=profile, length_scale=length_scale)
    lengths = dataset_lengths(dataset, seed)
    max_tokens = microbatch_limit(dataset, lengths, None, packing_ratio)
    batches = [[int(lengths[i]) for i in ids]
               for ids in minibatch_samples(dataset, len(lengths), world_size * minibatch_size, num_minibatches, seed)]
    rows = []
    for name, spec in BALANCERS.items():
        preds: dict[str, list[Prediction]] = {s: [] for s in SEMANTICS}
        microbatches = 0
        options = spec.options()
        # What the planner believes (its cost model) about when ranks are free, and what it costs.
        planned, works = StaleClock(world_size, staleness), []
        for lens in batches:
            plan, queue = plan_minibatch(spec, options, lens, world_size, max_tokens, plan_cost, planned.ready())
            if queue is not None:  # claims at run time: the queue's entries go to whichever rank is free first
                plan = scheduled(queue, lens, cost, world_size)
            planned.advance(rank_work(plan, lens, plan_cost))
            works.append(rank_work(plan, lens, cost))
            microbatches += sum(len(r) for r in plan)
            for s in SEMANTICS:
                preds[s].append(predict(plan, lens, world_size, max_tokens, cost, s))
        for s in SEMANTICS:
            if s == "collective" and not spec.equal_counts:
                continue
            p = preds[s]
            rows.append(BalancerQuality(name, s, sum(x.time for x in p), sum(x.bound for x in p),
                                        run_bubble_rate(p, world_size), run_bubble_rate(p, world_size, of_bound=True),
                                        microbatches / (world_size * len(batches))))
        if staleness and spec.queue is None:  # a claim queue needs every rank in one minibatch
            bound = stale_lower_bound(batches, world_size, max_tokens, cost, staleness)
            rows.append(BalancerQuality(name, f"odc s={staleness}", stale_clock(works, staleness).done[-1], bound,
                                        stale_bubble_rate(works, staleness),
                                        bubble_rate(sum(least_work(b, max_tokens, cost) for b in batches),
                                                    world_size, bound),
                                        microbatches / (world_size * len(batches))))
    return rows


def format_table(rows: list[BalancerQuality]) -> str:
    lines = [f"{'balancer':<11} {'semantics':<11} {'time':>9} {'bound':>9} {'over bound':>10} "
             f"{'bubble':>7} {'bound bubble':>12} {'mb/rank':>7}"]
    for r in rows:
        lines.append(f"{r.balancer:<11} {r.semantics:<11} {r.time:>9.4g} {r.bound:>9.4g} {r.over_bound:>10.2%} "
                     f"{r.bubble_rate:>7.1%} {r.bound_bubble_rate:>12.1%} {r.microbatches_per_rank:>7.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(command_name(__spec__.name), description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="longalign", choices=sorted(PROFILES),
                        help="the length profile samples are drawn from")
    parser.add_argument("--world-size", type=positive_int, default=8, help="ranks a minibatch is split over")
    parser.add_argument("--minibatch-size", type=positive_int, default=4, help="samples per rank per minibatch")
    parser.add_argument("--num-minibatches", type=positive_int, default=50, help="minibatches planned")
    parser.add_argument("--cost", type=parse_cost, default="quadratic:1p5b",
                        help="the cost model that scores plans (the truth): linear, quadratic:FIT or a "
                             "calibration file")
    parser.add_argument("--plan-cost", type=parse_cost, default=None,
                        help="the cost model balancers plan with (default: --cost)")
    parser.add_argument("--packing-ratio", type=ratio_at_least_one, default=1.0,
                        help="the packing limit (max_tokens) over the longest sample")
    parser.add_argument("--length-scale", type=positive_float, default=1.0, help="every length multiplied by this")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="draws the samples and minibatches")
    parser.add_argument("--staleness", type=nonnegative_int, default=0,
                        help="also time the plans as stale-synchronous ODC with this staleness")
    args = parser.parse_args(argv)
    cost = args.cost
    plan_cost = args.plan_cost or cost
    try:
        rows = plan_quality(args.profile, args.world_size, args.minibatch_size, args.num_minibatches, cost, plan_cost,
                            args.packing_ratio, args.length_scale, args.seed, args.staleness)
    except ConfigError as e:
        fail(ConfigError(in_options(str(e), OPTIONS)), parser.prog)
    print(f"{args.profile} x{args.length_scale:g}, {args.world_size} ranks, minibatch {args.minibatch_size} per rank, "
          f"{args.num_minibatches} minibatches, packing ratio {args.packing_ratio:g}; planned with {plan_cost.label}, "
          f"scored with {cost.label}; times summed over minibatches")
    print(format_table(rows))
    mini = next(r for r in rows if (r.balancer, r.semantics) == ("lb_mini", "odc"))
    micro = next(r for r in rows if (r.balancer, r.semantics) == ("lb_micro", "collective"))
    print(f"\ncollective+lb_micro bubble {micro.bubble_rate:.1%} | odc+lb_mini bubble {mini.bubble_rate:.1%} "
          f"| lower bound's unavoidable bubble {mini.bound_bubble_rate:.1%} "
          f"| lb_mini odc time {mini.over_bound:+.2%} over the bound")
    if args.staleness:
        carry = next(r for r in rows if (r.balancer, r.semantics) == ("lb_carry", f"odc s={args.staleness}"))
        print(f"odc+lb_carry at staleness {args.staleness}: predicted bubble {carry.bubble_rate:.2%} | the "
              f"synchronous per-minibatch lower bound's {mini.bound_bubble_rate:.2%} | the stale lower bound's "
              f"{carry.bound_bubble_rate:.2%} | predicted speedup over odc+lb_mini {mini.time / carry.time:.3f}x")


if __name__ == "__main__":
    with ends_cleanly(command_name(__spec__.name)):
        main()
