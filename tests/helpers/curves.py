"""Results roots for the Fig. 9 and convergence figure tests: RL rows, and runs on the learnable
token source with traces whose losses and times follow formulas the tests know.

RL: samples/s = RL_SPEED[series] x (1 + minibatch_size / 100) x MODEL_SPEED[model].
Convergence: the minibatch loss at step k is 1 + 6 exp(-k / 20) plus the series' OFFSET(k); the
ranks' loss sums split it by their labelled tokens; minibatch k ends at (k + 1) x STEP_S[series]
after the run's start on its slower rank.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import yaml

from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION
from tests.helpers import with_series
from tests.helpers.figures import write_runs

RL_SERIES = [("collective", "verl", {}), ("collective", "lb_micro", {}), ("odc", "lb_micro", {}),
             ("odc", "lb_mini", {"equal_samples": True})]
RL_SPEED = {("collective", "verl"): 1.0, ("collective", "lb_micro"): 1.05, ("odc", "lb_micro"): 1.08,
            ("odc", "lb_mini"): 1.1}
MODEL_SPEED = {"qwen2_1p5b": 10.0, "qwen2_14b": 2.0}
RL_DEVICES = {"qwen2_1p5b": 8, "qwen2_14b": 16}
RL_MINIBATCHES = [4, 8]

STEPS = 30
WORLD = 2
# (engine, balancer, engine options): the staleness option makes two variants of one series.
LOSS_SERIES = [("collective", "lb_micro", {}), ("odc", "lb_mini", {"staleness": 0}),
               ("odc", "lb_mini", {"staleness": 1}), ("odc", "lb_micro", {"staleness": 0})]
STEP_S = {("collective", "lb_micro", 0): 0.5, ("odc", "lb_mini", 0): 0.4, ("odc", "lb_mini", 1): 0.35,
          ("odc", "lb_micro", 0): 0.45}
START = 1000.0
PRECISIONS = ["fp32", "bf16"]
# Rank r's microbatches of every minibatch: (tokens, samples).
MICROBATCHES = [[(300, 3), (120, 1)], [(200, 2)]]


def base_loss(step: int) -> float:
    return 1 + 6 * math.exp(-step / 20)


def offset(engine: str, balancer: str, staleness: int, precision: str, step: int) -> float:
    """How far a series' loss sits from the collective baseline's at a step."""
    if engine == "collective":
        return 0.0
    scale = 1e-3 if precision == "bf16" else 1e-6
    # Growing with the step, so the largest gap falls at one step (no ties for the table to break).
    wave = (step % 7) if balancer == "lb_mini" else -(step % 5)
    return scale * wave * (1 + step / STEPS) * (1 + staleness)


def labelled(rank: int) -> int:
    return sum(t - s for t, s in MICROBATCHES[rank])


def _config(engine: str, balancer: str, options: dict, precision: str, tokens: str, bal_options: dict) -> str:
    return yaml.safe_dump({"precision": precision, "dataset": {"name": "longalign", "loader": "profile",
                                                              "tokens": tokens},
                           "engine": {"name": engine, **options},
                           "balancer": {"name": balancer, "options": bal_options}}, sort_keys=False)


def _row(run_id: str, engine: str, balancer: str, trace: str | None, config: str, **setting) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(run_id=run_id, schema_version=SCHEMA_VERSION, status="ok", backend="local", engine=engine,
               balancer=balancer,
               cost_model="linear", trace=trace, config=config, tokens_per_s=1.0, bubble_rate=0.1,
               **{"seed": 0, "warmup_minibatches": 0, **setting})
    return with_series(row)


def loss_trace(engine: str, balancer: str, staleness: int, precision: str) -> pd.DataFrame:
    step_s = STEP_S[(engine, balancer, staleness)]
    events = []
    for k in range(STEPS):
        loss = base_loss(k) + offset(engine, balancer, staleness, precision, k)
        for r in range(WORLD):
            t0 = START + k * step_s
            end = START + (k + 1) * step_s - (0.05 if r == 1 else 0.0)
            for j, (tokens, samples) in enumerate(MICROBATCHES[r]):
                events.append(dict(rank=r, minibatch=k, microbatch=j, kind="microbatch", unit="", t0=t0, t1=end,
                                   tokens=tokens, samples=samples, loss_sum=None))
            events.append(dict(rank=r, minibatch=k, microbatch=-1, kind="minibatch", unit="", t0=t0, t1=end,
                               tokens=None, samples=None, loss_sum=loss * labelled(r)))
    return pd.DataFrame(events)


def write_loss_runs(folder: Path) -> pd.DataFrame:
    rows = []
    setting = dict(dataset="longalign", model="tiny", world_size=WORLD, minibatch_size=4, packing_ratio=1,
                   length_scale=1 / 64, max_tokens=1024, num_minibatches=STEPS)
    (folder / "traces").mkdir(parents=True, exist_ok=True)
    for precision in PRECISIONS:
        for engine, balancer, options in LOSS_SERIES:
            staleness = options.get("staleness", 0)
            run_id = f"{engine}-{balancer}-{staleness}-{precision}"
            loss_trace(engine, balancer, staleness, precision).to_csv(folder / "traces" / f"{run_id}.csv",
                                                                       index=False)
            config = _config(engine, balancer, {"prefetch": True, **options}, precision, "learnable", {})
            rows.append(_row(run_id, engine, balancer, f"traces/{run_id}.csv", config, precision=precision,
                             samples_per_s=1 / STEP_S[(engine, balancer, staleness)], **setting))
    # A run on synthetic ids: its loss curve means nothing and is not drawn.
    synthetic = "collective-synthetic"
    loss_trace("collective", "lb_micro", 0, "fp32").to_csv(folder / "traces" / f"{synthetic}.csv", index=False)
    rows.append(_row(synthetic, "collective", "lb_micro", f"traces/{synthetic}.csv",
                     _config("collective", "lb_micro", {}, "fp32", "synthetic", {}), precision="fp32",
                     samples_per_s=1.0, **{**setting, "seed": 1}))
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.to_csv(folder / "runs.csv", index=False)
    return table


def rl_samples_per_s(engine: str, balancer: str, model: str, minibatch_size: int) -> float:
    return RL_SPEED[(engine, balancer)] * (1 + minibatch_size / 100) * MODEL_SPEED[model]


def write_rl_runs(folder: Path) -> pd.DataFrame:
    """RL rows beside the SFT fixture rows, in one experiment folder (as results/sim_paper holds both)."""
    sft = write_runs(folder)
    rows = []
    for model, devices in RL_DEVICES.items():
        for mb in RL_MINIBATCHES:
            for engine, balancer, options in RL_SERIES:
                config = yaml.safe_dump({"dataset": {"name": "grpo", "loader": "grpo", "grpo": {"group_size": 16}},
                                         "engine": {"name": engine}, "balancer": {"name": balancer,
                                                                                  "options": options}})
                rows.append(_row(f"rl-{engine}-{balancer}-{model}-{mb}", engine, balancer, None, config,
                                 dataset="grpo", model=model, world_size=devices, minibatch_size=mb,
                                 packing_ratio=1, length_scale=1.0, max_tokens=17408, precision="bf16",
                                 num_minibatches=50, samples_per_s=rl_samples_per_s(engine, balancer, model, mb)))
    table = pd.concat([sft, pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True)
    table.to_csv(folder / "runs.csv", index=False)
    return table
