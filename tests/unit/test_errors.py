"""Every bad input listed in docs/errors.md is refused in one line before anything is written.

The cases run in-process through `odc_bench.cli.precheck`, the check `python -m odc_bench`
makes before Hydra starts; a few also through the command's entry function for the exit status
and the line on stderr, and one as a real command line.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension
from omegaconf import OmegaConf

from odc_bench.cli.precheck import precheck
from odc_bench.config.compose import CONF_DIR, options_with_key
from odc_bench.errors import ConfigError, interrupt_within
from odc_bench.plan.spec import Planner
from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION
from odc_bench.results.table import read_table
from tests.helpers import REPO, odc_bench

ERRORS_DOC = REPO / "docs" / "errors.md"
SPACED_LIB = "/opt/my tools/torch/lib"


def _jsonl(text: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "d.jsonl").write_text(text)
    return setup


def _runs_csv(text: str | None) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "results").mkdir()
        if text is None:
            (tmp / "results" / "runs.csv").mkdir()
        else:
            (tmp / "results" / "runs.csv").write_text(text)
    return setup


def _bytes(data: bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "d.jsonl").write_bytes(data)
    return setup


def _no_slurm(tmp: Path) -> dict[str, str]:
    """A PATH without SLURM's commands (nothing else of it is needed to check the command line)."""
    (tmp / "bin").mkdir()
    return {"PATH": str(tmp / "bin")}


def _long_tmpdir(tmp: Path) -> dict[str, str]:
    """A TMPDIR as some clusters set it, 80 bytes below the scratch folder."""
    (tmp / ("t" * 80)).mkdir()
    return {"TMPDIR": str(tmp / ("t" * 80))}


def _profile(text: str, name: str = "mine") -> Callable[[Path], None]:
    """A hardware profile of the user's own, where `hydra.searchpath=[file://{tmp}/conf]` finds it."""
    def setup(tmp: Path) -> None:
        (tmp / "conf" / "backend" / "hardware").mkdir(parents=True)
        (tmp / "conf" / "backend" / "hardware" / f"{name}.yaml").write_text(text)
    return setup


MY_PROFILE = ["backend=sim", "hydra.searchpath=[file://{tmp}/conf]", "backend/hardware=mine"]


def _file(tmp: Path) -> None:
    (tmp / "file").write_text("not a folder\n")


def _empty_dir(tmp: Path) -> None:
    (tmp / "not_a_dataset").mkdir()


def _text_file(name: str, text: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / name).write_text(text)
    return setup


def _parquet(tmp: Path) -> None:
    import pandas as pd

    pd.DataFrame({"n": [12, 40]}).to_parquet(tmp / "d.parquet")


def _hub_with_a_damaged_shard(tmp: Path) -> None:
    import pandas as pd

    (tmp / "hub").mkdir()
    pd.DataFrame({"n": [12, 40]}).to_parquet(tmp / "hub" / "train-00000-of-00002.parquet")
    (tmp / "hub" / "train-00001-of-00002.parquet").write_bytes(b"PAR1 cut short")


HEADER = ",".join(COLUMNS)
OTHER_VERSION = SCHEMA_VERSION + 1
ROW_OTHER = ",".join(str(OTHER_VERSION) if c == "schema_version" else "x" for c in COLUMNS)
# A row of this schema whose samples_per_s holds text (every other column empty or its run's id).
ROW_TEXT_IN_NUMBERS = ",".join({"run_id": "abc", "schema_version": str(SCHEMA_VERSION),
                                "samples_per_s": "fast"}.get(c, "") for c in COLUMNS)
ROW_OK = ",".join({"run_id": "abc", "schema_version": str(SCHEMA_VERSION), "status": "ok"}.get(c, "") for c in COLUMNS)
# The table with its first two columns swapped, as a spreadsheet's drag leaves it.
_REORDERED = "\n".join(",".join([line.split(",")[1], line.split(",")[0], *line.split(",")[2:]])
                        for line in (HEADER, ROW_OK))

# case -> (command line, the message it must give, set-up of the files it names, which may return
# environment variables the case needs)
TWO_NODES = ["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1"]

CASES: dict[str, tuple[list[str], str, Callable[[Path], dict[str, str] | None] | None]] = {
    # the command line
    "unknown-key": (["no_such_key=1"], "unknown config key 'no_such_key'; check its spelling", None),
    "option-file-not-yaml": (MY_PROFILE, "conf/backend/hardware/mine.yaml cannot be read as a config (expected the "
                             "node content, but found '<stream end>', line 3, column 1); fix the file",
                             _profile("name: mine\npeak_tflops: [1,\n")),
    "option-file-a-list": (MY_PROFILE, "backend.hardware must be a section of keys, got ['a', 'b']; the file that "
                           "sets it must hold settings by name (key: value)", _profile("- a\n- b\n")),
    "option-named-as-the-packages": (
        [*MY_PROFILE[:2], "backend/hardware=h100"], "conf/backend/hardware/h100.yaml is never read: Hydra finds the "
        "package's backend/hardware=h100 first; rename yours (and its name: field) and choose it by its new name",
        _profile((CONF_DIR / "backend" / "hardware" / "h100.yaml").read_text(), "h100")),
    "key-of-another-option": (["engine=collective", "engine.staleness=1"],
                              "config key 'engine.staleness' belongs to engine=odc, not to the engine chosen", None),
    "added-key": (["+no_such_key=1"], "unknown config key 'no_such_key' (added by '+no_such_key=1')", None),
    "added-option": (["balancer=lb_mini", "engine=odc", "+balancer.options.nosuch=1"],
                     "unknown config key 'balancer.options.nosuch'", None),
    "unknown-option": (["engine=nosuch"], "unknown engine option 'nosuch'; choose one of collective, odc", None),
    "unknown-task": (["task=nosuch"], "unknown task option 'nosuch'", None),
    "option-given-by-path": (["backend=sim", "backend/hardware=./mine.yaml"],
                             "backend/hardware=./mine.yaml: an option of backend/hardware is chosen by its name, not "
                             "its path: put the file in DIR/backend/hardware/NAME.yaml and add --config-dir DIR, then "
                             "backend/hardware=NAME (docs/configuration.md)", None),
    "malformed-override": (["world_size=[1,"], "'world_size=[1,': Hydra cannot read it (no viable alternative at input "
                           "'[1,'); if the value is one string, quote it: 'world_size=\"[1,\"'", None),
    # A path Hydra reads only quoted: the line gives the override quoted as one shell word.
    "unquoted-value": (["results_dir=out/ünï"], "if the value is one string, quote it: 'results_dir=\"out/ünï\"'",
                       None),
    "unquoted-quote": (["results_dir=out/q'1"], """quote it: 'results_dir="out/q'"'"'1"'""", None),
    "sweep-without-multirun": (["world_size=1,2"], "'world_size=1,2' lists several values; add --multirun", None),
    "sweep-of-no-values": (["--multirun", "seed=range(0,0)"], "'seed=range(0,0)' gives no values, so the sweep would "
                           "have no runs; give it at least one", None),
    "sweep-beyond-this-host": (["--multirun", "seed=range(0,1000000000000000)"],
                               "'seed=range(0,1000000000000000)' makes 1,000,000,000,000,000 runs, more than this "
                               "host can list", None),
    "sweep-of-an-interval": (["--multirun", "seed=interval(0,1)"], "'seed=interval(0,1)' is an interval, which a grid "
                             "sweep cannot list", None),
    # values
    "world-size-zero": (["world_size=0"], "world_size must be at least 1, got 0", None),
    "not-an-integer": (["minibatch_size=2.5"], "minibatch_size must be an integer, got 2.5", None),
    "negative-seed": (["seed=-1"], "seed must be at least 0", None),
    "seed-too-large": (["seed=99999999999999999999"], "seed must be below 2**63, got 99999999999999999999", None),
    "warmup-too-long": (["num_minibatches=2", "warmup_minibatches=2"],
                        "warmup_minibatches (2) must be below num_minibatches (2)", None),
    "bad-precision": (["precision=fp16"], "precision must be one of fp32, bf16, got 'fp16'", None),
    "bad-timeout": (["timeout_s=0"], "timeout_s must be a positive number of seconds, got 0", None),
    "timeout-too-long": (["timeout_s=1e15"],
                         "timeout_s must be below 2**31 seconds (about 68 years), got 1000000000000000.0", None),
    "bad-deadline": (["deadline_s=-5"], "deadline_s must be a positive number of seconds or null", None),
    "bad-device": (["device=tpu"], "device must be one of auto, cpu, cuda, got 'tpu'", None),
    "no-cuda": (["device=cuda"], "device=cuda but no CUDA device is visible", None),
    "text-read-as-a-number": (["results_dir=2024"],
                              "results_dir must be a string, got 2024; Hydra reads it as a number: to give it as "
                              "text, quote it for Hydra inside the shell's quotes ('results_dir=\"2024\"'), or give a "
                              "file or folder of that name as ./2024", None),
    "bad-threads": (["threads_per_rank=0"], "threads_per_rank must be null or a positive integer", None),
    "threads-beyond-the-cpus": (["threads_per_rank=99999999999"],
                                "threads_per_rank=99999999999 is more threads than the ", None),
    "bad-compile": (["compile=maybe"], "compile must be true or false or null, got 'maybe'", None),
    # torch's C++ build as it is under a folder with a space (tests/unit/test_compile_link.py)
    "compile-cannot-link": (["device=cpu", "compile=true"], "compile=true on CPU, but torch.compile's C++ build hands "
                            f"the linker {SPACED_LIB!r} unquoted, split at its space", None),
    "compile-with-op-checkpointing": (["compile=true", "backend.recompute=true", "backend.recompute_mode=op"],
                                      "compile=true and backend.recompute_mode=op do not run together", None),
    "checkpoint-on-sim": (["backend=sim", "checkpoint.every=5"],
                          "checkpoint.every=5 saves a real run's engine state; backend=sim has none to save", None),
    "bad-recompute-blocks": (["backend.recompute_blocks=0"],
                             "backend.recompute_blocks must be a share of the layers in (0, 1], got 0", None),
    "bad-engine-option": (["engine=odc", "engine.prefetch=sometimes"],
                          "engine.prefetch must be true or false, got 'sometimes'", None),
    "bad-engine-backend": (["engine.backend=tcp"], "engine.backend must be one of auto, shm, gloo, nccl, got 'tcp'",
                           None),
    "engine-backend-off-device": (["device=cpu", "engine.backend=nccl"],
                                  "engine.backend=nccl cannot run on cpu tensors; use shm or gloo or auto", None),
    "bad-balancer-option": (["balancer=dynamic", "engine=odc", "balancer.options.slack=-1"],
                            "balancer.options.slack must be a number >= 0", None),
    "unknown-cost-model": (["balancer.cost_model=nosuch"], "balancer.cost_model must be one of linear, quadratic, "
                           "flops, calibrated, got 'nosuch'", None),
    "no-calibration": (["balancer.cost_model=calibrated", "balancer.calibration={tmp}/none.json"],
                       "no calibration at", None),
    "bad-packing-ratio": (["packing_ratio=0.5"], "packing_ratio must be a number >= 1, got 0.5", None),
    "bad-length-scale": (["dataset.length_scale=0"], "dataset.length_scale must be a positive number", None),
    "bad-shard": (["engine.shard=partial"], "engine.shard must be one of full, hybrid, got 'partial'", None),
    "bad-odc-fetch": (["backend=sim", "backend.odc_fetch=random"],
                      "backend.odc_fetch must be one of owner, nearest, got 'random'", None),
    "bad-nic-rails": (["backend=sim", "backend.hardware.nic_rails=3"],
                      "the hardware's NIC rails per node, backend.hardware.nic_rails (3), must divide "
                      "gpus_per_node (8): give gpus_per_node a multiple of 3, or set backend.hardware.nic_rails "
                      "to a divisor of 8", None),
    "no-nic-rails": (["backend=sim", "backend.hardware.nic_rails=0"], "backend.hardware.nic_rails must be at least 1, "
                     "got 0", None),
    "model-size-zero": (["model.hidden_size=0"], "model.hidden_size must be at least 1, got 0", None),
    "completion-without-subcommand": (["--shell-completion"], "--shell-completion takes one of install=SHELL, "
                                      "uninstall=SHELL or query=SHELL (SHELL: bash, zsh or fish)", None),
    "optim-lr-negative": (["optim.lr=-1"], "optim.lr must be >= 0 (AdamW's learning rate), got -1", None),
    "optim-beta-of-one": (["optim.betas=[0.9,1.0]"], "optim.betas must each lie in [0, 1), got [0.9, 1.0]", None),
    "primitives-on-cuda-ipc-without-gpu": (["task=primitives", "primitives.transport=cuda_ipc"],
                                           "primitives.transport=cuda_ipc measures GPU memory and this machine has "
                                           "no CUDA device; use shm or mpi", None),
    "primitives-too-small": (["task=primitives", "primitives.min_bytes=1"],
                             "primitives.min_bytes (1) must hold at least one", None),
    "hardware-not-a-number": (["backend=sim", "backend.hardware.peak_tflops=abc"],
                              "backend.hardware.peak_tflops must be a number, got 'abc'", None),
    "hardware-not-positive": (["backend=sim", "backend.hardware.link_gbps=0"],
                              "backend.hardware.link_gbps must be a positive number, got 0", None),
    "hardware-share-over-one": (["backend=sim", "backend.hardware.matmul_efficiency=5"],
                                "backend.hardware.matmul_efficiency must be a share in (0, 1], got 5", None),
    "cpu-profile-of-another-precision": (["backend=sim", "backend/hardware=cpu", "precision=bf16"],
                                         "sim-tiny-cpu.json was calibrated on precision=fp32 runs, whose timings are "
                                         "not precision=bf16's on this CPU; set precision=fp32, or calibrate on "
                                         "precision=bf16 runs", None),
    "cpu-profile-of-other-threads": (["backend=sim", "backend/hardware=cpu", "threads_per_rank=2"],
                                     "sim-tiny-cpu.json was calibrated on runs of 1 threads per rank, whose timings "
                                     "are not threads_per_rank=2's; set threads_per_rank=1, or calibrate on such runs",
                                     None),
    "cpu-profile-of-compiled-runs": (["backend=sim", "backend/hardware=cpu", "compile=true"],
                                     "sim-tiny-cpu.json was calibrated on eager runs, whose timings are not "
                                     "compile=true's on this CPU; set compile=false, or calibrate on such runs", None),
    "cpu-profile-on-cuda": (["backend=sim", "backend/hardware=cpu", "device=cuda"],
                            "sim-tiny-cpu.json times this machine's CPU ranks, not device=cuda's; set device=cpu or "
                            "auto, or simulate GPUs on a GPU profile", None),
    "cpu-profile-of-another-unit": (["backend=sim", "backend/hardware=cpu", "model.hidden_size=256"],
                                    "sim-tiny-cpu.json was fitted on model tiny's units, not on units of this model's "
                                    "hidden_size 256 (calibrated: 128); simulate it on a GPU profile, or calibrate "
                                    "on it", None),
    "cpu-profile-for-a-large-model": (["backend=sim", "backend/hardware=cpu", "model=qwen2_32b"],
                                      "but model qwen2_32b would need about", None),
    # combinations that cannot run
    "lb-mini-on-collective": (["balancer=lb_mini"], "balancer lb_mini gives ranks different microbatch counts, "
                              "which engine=collective cannot run", None),
    "dynamic-on-collective": (["balancer=dynamic"], "balancer dynamic gives ranks different microbatch counts", None),
    "hybrid-with-staleness": (["engine=odc", "engine.shard=hybrid", "engine.staleness=1"],
                              "engine.shard=hybrid is synchronous only so far", None),
    "ranks-per-node-on-sim": (["backend=sim", "engine.ranks_per_node=2"],
                              "engine.ranks_per_node=2 emulates nodes for real runs", None),
    "unsimulated-option-on-sim": (["backend=sim", "engine=odc", "engine.prefetch=false"],
                                  "engine.prefetch=false sets how a real run's engine runs, which the simulator does "
                                  "not model (its engine=odc runs as with engine.prefetch=true); leave "
                                  "engine.prefetch unset with backend=sim", None),
    "hybrid-on-the-cpu-profile": (["backend=sim", "backend/hardware=cpu", "engine.shard=hybrid"],
                                  "engine.shard=hybrid needs nodes: a GPU hardware profile", None),
    "dynamic-with-staleness": (["engine=odc", "engine.staleness=1", "balancer=dynamic"],
                               "balancer dynamic hands out work from one counter", None),
    "bad-ranks-per-node": (["engine.ranks_per_node=0"], "engine.ranks_per_node must be null or an integer >= 1, got 0",
                           None),
    "negative-staleness": (["engine=odc", "engine.staleness=-1"], "engine.staleness must be an integer >= 0, got -1",
                           None),
    # sizes that must divide or fit
    "heads-do-not-divide": (["model.num_heads=3"], "hidden_size 128 must divide by num_heads 3", None),
    "odd-head-dim": (["model.head_dim=7"], "model.head_dim must be even and at least 2", None),
    "ranks-per-node-does-not-divide": (["engine.shard=hybrid", "engine.ranks_per_node=3"],
                                       "engine.ranks_per_node=3 must divide world_size=2", None),
    "slurm-hybrid-nodes": ([*TWO_NODES, "engine.backend=gloo", "engine.shard=hybrid"],
                           "engine.shard=hybrid shards within a node: this job's nodes have "
                           "hydra.launcher.tasks_per_node=1 ranks each, and engine.ranks_per_node is unset", None),
    "slurm-nodes-do-not-divide": (["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "world_size=3"],
                                  "hydra.launcher.nodes (2) x tasks_per_node (3) must equal world_size (3)", None),
    "slurm-time-limit-inside-its-warning": (["-m", "hydra/launcher=slurm", "hydra.launcher.timeout_min=2"],
                                            "hydra.launcher.timeout_min=2 ends the job within SLURM's time-limit "
                                            "warning (hydra.launcher.signal_delay_s=120 s before the end), which "
                                            "comes as the job starts: submitit would requeue it 3 times "
                                            "(max_num_timeout), then end the run, before it trains; set timeout_min "
                                            "above 2, or signal_delay_s below 120", None),
    "sweep-of-a-hydra-setting": (["-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug,gpu"],
                                 "'hydra.launcher.partition=debug,gpu' lists several values of a setting of Hydra's, "
                                 "which Hydra does not sweep; give it one value, and run the command once per value",
                                 None),
    "launcher-setting-of-another-type": (["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=1.5"],
                                         "Error merging override hydra.launcher.nodes=1.5 (Value '1.5' of type "
                                         "'float' could not be converted to Integer)", None),
    "slurm-submitit-folder-under-a-file": (["-m", "hydra/launcher=slurm",
                                            "hydra.launcher.submitit_folder={tmp}/file/%j"],
                                           "/file is not a directory; set it to a folder (one every node shares)",
                                           _file),
    "slurm-no-nodes": (["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=0"],
                       "hydra.launcher.nodes must be a whole number, at least 1, got 0", None),
    "slurm-negative-time-limit": (["-m", "hydra/launcher=slurm", "hydra.launcher.timeout_min=-1"],
                                  "hydra.launcher.timeout_min, each run's time limit in minutes, cannot be negative "
                                  "(0: no limit, as sbatch --time=0), got -1", None),
    "slurm-tasks-per-node": (["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "world_size=4"],
                             "set hydra.launcher.tasks_per_node=2", None),
    "slurm-odc-across-nodes": ([*TWO_NODES, "engine=odc"],
                               "engine=odc on transport shm keeps its symmetric heap in POSIX shared memory "
                               "(/dev/shm) on one host, which cannot span hydra.launcher.nodes=2; "
                               "set engine.transport=mpi (docs/transport.md) or hydra.launcher.nodes=1", None),
    "mpi-network-only-without-mpi": (["engine=odc", "engine.transport=shm", "engine.mpi_network_only=true"],
                                     "engine.mpi_network_only=true needs engine.transport=mpi, got shm", None),
    "slurm-shm-across-nodes": (TWO_NODES,
                               "engine.backend=shm (the CPU default) runs FSDP2 over shared memory, which cannot span "
                               "hydra.launcher.nodes=2; set engine.backend=gloo", None),
    "group-set-to-null": (["model=null"], "model=null names no model option; choose one of llama2_7b, ", None),
    "empty-text-setting": (["results_dir=''"], "results_dir is empty; give it a value, or leave it out where it "
                                                "has a default", None),
    "primitives-on-sim": (["task=primitives", "backend=sim"], "task=primitives measures this host's transports with "
                                                             "real ranks; backend=sim has no model of them", None),
    "group-set-to-a-number": (["task=0"], "task=0 names no task option (Hydra reads 0 as a number; quote it, "
                              "task='0', where an option or folder has that name); choose one of primitives, train",
                              None),
    "several-options-of-a-group": (["balancer=[lb_mini,lb_micro]"], "balancer=[lb_mini,lb_micro] chooses several "
                                   "balancer options at once, which Hydra merges into one; choose one, or sweep them: "
                                   "--multirun balancer=lb_mini,lb_micro", None),
    "basic-sweeper": (["-m", "hydra/sweeper=basic", "engine=odc,collective", "balancer=lb_mini", "backend=sim"],
                      "hydra/sweeper=basic is Hydra's own, which checks no run before the sweep starts", None),
    "stock-submitit-launcher": (["-m", "hydra/launcher=submitit_slurm", "backend=sim"],
                                "hydra/launcher=submitit_slurm is hydra-submitit-launcher's own, which runs the whole "
                                "run in every task", None),
    "slurm-not-on-path": (["-m", "hydra/launcher=slurm"], "hydra/launcher=slurm needs SLURM's sbatch and squeue on "
                          "PATH, and this machine has none", _no_slurm),
    "slurm-odc-gpus-across-nodes": (["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2",
                                     "hydra.launcher.tasks_per_node=1", "hydra.launcher.gpus_per_node=1", "engine=odc"],
                                    "engine=odc on transport cuda_ipc keeps its symmetric heap in GPU memory shared "
                                    "through CUDA IPC handles on one host, which cannot span hydra.launcher.nodes=2; "
                                    "set engine.transport=nvshmem engine.shard=hybrid", None),
    "pool-smaller-than-minibatch": (["dataset.num_samples=3"],
                                    "the dataset has 3 usable samples, fewer than one minibatch", None),
    "lengths-as-one-json-array": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl", "dataset.tokens=synthetic"],
                                  "a line holding one JSON array of numbers is one sample's token ids: write token "
                                  "counts one per line", _jsonl("[512, 1024, 2048, 700, 300, 900, 1500, 64, 80]\n")),
    "sample-over-max-tokens": (["max_tokens=64"], "over the microbatch limit max_tokens=64", None),
    "groups-do-not-divide": (["dataset=grpo", "dataset.length_scale=0.015625", "minibatch_size=3"],
                             "a minibatch of world_size x minibatch_size = 6 samples is not a multiple of 16", None),
    "grpo-pool-smaller-than-minibatch": (["dataset=grpo", "dataset.length_scale=0.015625", "minibatch_size=16",
                                          "dataset.grpo.num_prompts=1"],
                                         "needs 2 prompts, more than dataset.grpo.num_prompts=1", None),
    "sample-over-memory": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                           "a sample of 5000000 tokens cannot fit, samples up to about",
                           _jsonl("".join(f"{100 + i}\n" for i in range(20)) + "5000000\n")),
    "max-tokens-over-memory": (["max_tokens=2000000"], "lower max_tokens (to ", None),
    "scale-beyond-any-sequence": (["dataset.length_scale=1e300"],
                                  "dataset.length_scale=1e+300 makes samples of up to 6.554e+304 tokens, beyond any "
                                  "sequence a model takes", None),
    "model-over-memory": (["model=qwen2_32b"], "the model alone does not fit: use a smaller model or add ranks", None),
    "draw-over-host-memory": (["backend=sim", "num_minibatches=9999999999999"],
                              "planning num_minibatches=9999999999999 minibatches of world_size x minibatch_size = 8 "
                              "samples takes at least", None),
    # data
    "unknown-profile": (["dataset.profile=nosuch"], "unknown dataset profile 'nosuch'", None),
    "data-path-unset": (["dataset=jsonl"], "dataset=jsonl needs dataset.path", None),
    "grpo-num-samples": (["dataset=grpo", "dataset.num_samples=100"],
                         "dataset.num_samples does not apply to dataset=grpo", None),
    "bad-grpo-option": (["dataset=grpo", "dataset.grpo.clip_fraction=0"],
                        "dataset.grpo.clip_fraction must lie strictly between 0 and 1, got 0", None),
    "grpo-mean-out-of-reach": (["dataset=grpo", "dataset.grpo.mean_sample=100000"],
                               "dataset.grpo.mean_sample=100000 cannot be drawn: with prompts of 173 tokens on average "
                               "and dataset.grpo.clip_fraction=0.1 of the responses cut at "
                               "dataset.grpo.max_response_length=16384, it must lie between 1812 and 16557; change one "
                               "of them", None),
    "data-file-missing": (["dataset=jsonl", "dataset.path={tmp}/missing.jsonl"], "missing.jsonl does not exist", None),
    "data-hub-id": (["dataset=hf_disk", "dataset.path=zai-org/LongAlign-10k"],
                    "dataset.path zai-org/LongAlign-10k does not exist; point it at your data (if "
                    "zai-org/LongAlign-10k is a Hugging Face Hub id: the harness downloads nothing; fetch it with `hf "
                    "download "
                    "zai-org/LongAlign-10k --repo-type dataset --local-dir LongAlign-10k` and give dataset=hf_disk "
                    "dataset.path=LongAlign-10k)", None),
    "model-hub-id": (["model=Qwen/Qwen2.5-7B"], "or config.json (if Qwen/Qwen2.5-7B is a Hugging Face Hub id: the "
                     "harness downloads nothing; fetch it with `hf download Qwen/Qwen2.5-7B config.json --local-dir "
                     "Qwen2.5-7B` and give model=Qwen2.5-7B)", None),
    "data-path-name-too-long": (["dataset=jsonl", f"dataset.path={{tmp}}/{'d' * 300}/l.jsonl"],
                                "has a name of 300 bytes (dddddddddddd...), over the 255 its file system takes: no "
                                "file can have it; point it at your data", None),
    "data-not-text": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                      "d.jsonl is not text: it holds bytes that are not UTF-8", _bytes(bytes(range(256)) * 4)),
    "data-not-json-lines": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                            "d.jsonl is not JSON lines: line 1 is not a JSON value", _jsonl("length\n12\n")),
    "data-not-json": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"], "d.jsonl line 2 is not valid JSON",
                      _jsonl("120\n{oops\n")),
    "data-ids-not-integers": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                              "line 2: token ids must be integers >= 0, got 2.5 at position 1",
                              _jsonl("[1, 2, 3]\n[1, 2.5]\n")),
    "data-text-not-tokenized": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                                "line 1: expected a token count or a list of token ids, got text; tokenize it first",
                                _jsonl('"some text"\n')),
    "data-object-without-field": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                                  "line 1 is an object; set dataset.field", _jsonl('{"n": 5}\n')),
    "data-field-on-bare-counts": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl", "dataset.field=n"],
                                  "line 1 is a token count, not an object holding the key dataset.field",
                                  _jsonl("12\n40\n")),
    "data-negative-length": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"], "negative token count -4",
                             _jsonl("12\n-4\n")),
    "data-count-beyond-any-sequence": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                                       "line 2: a token count of 3000000000 is beyond any sequence a model takes",
                                       _jsonl("12\n3000000000\n")),
    "data-no-usable-sample": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"], "has no sample of at least 2 tokens",
                              _jsonl("1\n0\n")),
    "data-id-outside-vocabulary": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                                   "d.jsonl line 3: token id 2048 at position 1 is outside the model's vocabulary",
                                   _jsonl("[1, 2, 3]\n\n[4, 2048]\n")),
    "data-tokens-without-ids": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl", "dataset.tokens=data"],
                                "d.jsonl gives token counts, not ids, so dataset.tokens=data has nothing to train on",
                                _jsonl("12\n40\n")),
    "data-tokens-scaled": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl", "dataset.tokens=data",
                            "dataset.length_scale=0.5"],
                           "dataset.tokens=data trains on the data's ids as they are, which dataset.length_scale=0.5",
                           _jsonl("[1, 2, 3]\n")),
    "data-tokens-of-a-profile": (["dataset.tokens=data"],
                                 "dataset.tokens=data trains on a file's token ids, but dataset=longalign has none",
                                 None),
    "hf-disk-not-a-dataset": (["dataset=hf_disk", "dataset.path={tmp}/not_a_dataset"],
                              "doesn't contain any data files); point dataset.path at a folder written by "
                              "save_to_disk, a data file", _empty_dir),
    "hf-disk-not-a-data-file": (["dataset=hf_disk", "dataset.path={tmp}/notes.md"],
                                "notes.md is none of these", _text_file("notes.md", "# my notes\n")),
    "hf-disk-damaged-file": (["dataset=hf_disk", "dataset.path={tmp}/hub", "dataset.text_field=n"],
                             "hub could not be read to the end: Failed to read file", _hub_with_a_damaged_shard),
    "data-parquet-to-jsonl": (["dataset=jsonl", "dataset.path={tmp}/d.parquet"],
                              "d.parquet is a Parquet file, not one JSON value per line; dataset=hf_disk reads it",
                              _parquet),
    "data-json-array-to-jsonl": (["dataset=jsonl", "dataset.path={tmp}/d.json", "dataset.field=n"],
                                 "d.json holds one JSON array of samples, not one JSON value per line; "
                                 "dataset=hf_disk reads it", _text_file("d.json", '[{"n": 12}, {"n": 40}]')),
    # the results folder
    "results-dir-is-a-file": (["results_dir={tmp}/file"], "file is not a directory; set results_dir to a folder",
                              _file),
    "results-dir-under-a-file": (["results_dir={tmp}/file/sub"], "cannot be created", _file),
    "results-dir-on-proc": (["results_dir=/proc/x"], "results_dir /proc/x is on proc (/proc), a pseudo-filesystem",
                            None),
    "results-dir-on-sys": (["results_dir=/sys/kernel/x"], "results_dir /sys/kernel/x is on sysfs (/sys)", None),
    "tmpdir-too-long": ([], "bytes, from TMPDIR) is too long for the socket that starts the local ranks, 32 bytes "
                        "below it, where a socket's path holds 107: set TMPDIR to a folder of at most 75 bytes "
                        "(TMPDIR=/tmp)", _long_tmpdir),
    "results-dir-name-too-long": ([f"results_dir={{tmp}}/{'r' * 300}/sub"],
                                  "has a name of 300 bytes (rrrrrrrrrrrr...), over the 255 its file system takes; set "
                                  "results_dir to a folder with shorter names", None),
    "checkpoint-dir-under-a-file": (["num_minibatches=4", "checkpoint.every=2", "checkpoint.dir={tmp}/file/ckpt"],
                                    "/file/ckpt cannot be created: ", _file),
    "hydra-output-under-a-file": (["hydra.run.dir={tmp}/file/out"], "/file/out cannot be created: ", _file),
    "hydra-sweep-output-on-proc": (["--multirun", "world_size=1,2", "hydra.sweep.dir=/proc/x"],
                                   "Hydra's output folder /proc/x is on proc (/proc), a pseudo-filesystem showing the "
                                   "kernel's state, which cannot hold results; run from a folder you can write, or set "
                                   "hydra.sweep.dir to a folder on a disk", None),
    "runs-csv-is-a-folder": ([], "runs.csv is not a file", _runs_csv(None)),
    "runs-csv-other-columns": ([], f"does not have the columns of results schema version {SCHEMA_VERSION} (missing ",
                               _runs_csv("run_id,status,samples_per_s\nabc,ok,1.0\n")),
    "runs-csv-column-added": ([], "(unexpected notes); remove the column(s) it added (keep them in a file of your "
                                  "own), or move it away", _runs_csv(f"{HEADER},notes\n{ROW_OK},mine\n")),
    "runs-csv-columns-reordered": ([], "(same columns in another order); put them back in order with `python -m "
                                       "odc_bench.results migrate ", _runs_csv(f"{_REORDERED}\n")),
    "runs-csv-other-schema-version": ([], f"holds rows of schema_version {OTHER_VERSION}, this code writes "
                                          f"{SCHEMA_VERSION}", _runs_csv(f"{HEADER}\n{ROW_OTHER}\n")),
    "runs-csv-not-csv": ([], "is not a readable results table", _runs_csv('a,b\n"unterminated\n')),
    "runs-csv-text-in-numbers": ([], "runs.csv: the row of run abc holds 'fast' in column samples_per_s, which "
                                     "holds numbers; correct or remove that row",
                                 _runs_csv(f"{HEADER}\n{ROW_TEXT_IN_NUMBERS}\n")),
    "runs-csv-joined-with-cat": ([], "runs.csv: it holds its header again as its row 2 (after the header), as tables "
                                     "joined with cat do; merge tables with `python -m odc_bench.results collect "
                                     "DIR... --out FILE`, or remove that line",
                                 _runs_csv(f"{HEADER}\n{ROW_OK}\n{HEADER}\n{ROW_OK}\n")),
}


def _files_under(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")} if folder.is_dir() else {}


def _argv(case: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, str]]:
    """The case's command line, and the environment variables it needs."""
    if case == "compile-cannot-link":
        monkeypatch.setattr(torch.utils.cpp_extension, "TORCH_LIB_PATH", SPACED_LIB)
    overrides, _, setup = CASES[case]
    env = (setup(tmp) if setup is not None else None) or {}
    if "TMPDIR" in env:
        monkeypatch.setattr(tempfile, "tempdir", env["TMPDIR"])  # as Python takes it from TMPDIR, once
    argv = [o.format(tmp=tmp) for o in overrides]
    if not any(a.startswith("results_dir=") for a in argv):
        argv.append(f"results_dir={tmp / 'results'}")
    return argv, env


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_in_one_line_and_writes_nothing(case, tmp_path, monkeypatch):
    if case in ("no-cuda", "primitives-on-cuda-ipc-without-gpu") and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here, so asking for it is valid input")
    argv, env = _argv(case, tmp_path, monkeypatch)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    before = _files_under(tmp_path)
    with pytest.raises(ConfigError) as error:
        precheck(argv, Planner())
    message = str(error.value)
    assert CASES[case][1] in message
    assert "\n" not in message, "one line"
    assert _files_under(tmp_path) == before, "nothing written: no results, no lengths cache beside the data"


def test_docs_list_exactly_the_cases_tested():
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", ERRORS_DOC.read_text(), flags=re.MULTILINE)
    assert len(documented) == len(set(documented)), "each case once"
    assert set(documented) == set(CASES)
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", ["added-key", "compile-cannot-link", "lb-mini-on-collective", "data-not-json",
                                  "data-id-outside-vocabulary", "sample-over-memory", "runs-csv-other-schema-version",
                                  "results-dir-on-sys", "tmpdir-too-long"])
def test_the_command_exits_2_with_one_line_and_leaves_nothing_behind(case, tmp_path, monkeypatch, capsys):
    """main() as `python -m odc_bench` runs it, in this process: the exit status, the one line on
    stderr, and no file written, no Hydra output folder either."""
    argv, env = _argv(case, tmp_path, monkeypatch)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    before = _files_under(tmp_path)
    assert odc_bench(*argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("odc_bench: error: ") and CASES[case][1] in lines[0], err
    assert _files_under(tmp_path) == before, "nothing written, no Hydra output folder either"


@pytest.mark.slow
def test_the_command_line_exits_2_with_one_line_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """The entry point itself, as a shell runs it (one case: the others run in-process above)."""
    argv, extra = _argv("data-id-outside-vocabulary", tmp_path, monkeypatch)
    before = _files_under(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0", **extra)
    proc = subprocess.run([sys.executable, "-m", "odc_bench", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("odc_bench: error: ") and \
        CASES["data-id-outside-vocabulary"][1] in lines[0], proc.stderr
    assert _files_under(tmp_path) == before, "nothing written, no Hydra output folder either"


def test_a_key_of_any_group_option_is_traced_to_the_options_that_have_it():
    """Every top-level key of every option file (conf/GROUP/NAME.yaml) names NAME among its owners,
    and a key no option has names none, so the error says 'check its spelling'."""
    checked = 0
    for folder in (f for f in CONF_DIR.iterdir() if f.is_dir() and not f.name.startswith("_")):
        for path in folder.glob("*.yaml"):
            for key in OmegaConf.load(path):
                if key != "defaults":
                    assert path.stem in options_with_key(f"{folder.name}.{key}")[1], (path, key)
                    checked += 1
        assert options_with_key(f"{folder.name}.no_such_key") == (folder.name, [])
    assert checked > 20



@pytest.mark.slow
@pytest.mark.parametrize("argv", [("odc_bench", "--help"), ("odc_bench", "backend=sim", "results_dir=results"),
                                  ("odc_bench", "-m", "backend=sim", "engine=odc,collective", "results_dir=results"),
                                  ("odc_bench.whatif", "--hardware", "list")],
                         ids=["help", "a-run", "a-sweep", "the-what-if"])
def test_a_command_whose_reader_has_gone_ends_with_status_1_and_no_traceback(argv, tmp_path):
    """`... | head` with the reader gone before the first line: no traceback (a run's would have
    come through Hydra's report of a failed job, a sweep's from its logging), and a run ends
    before its row is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, stdout=write, stderr=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(REPO)), text=True, timeout=120)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (1, "")
    assert not (tmp_path / "results").exists()


def _define_a_class_as_ctrl_c_lands() -> None:
    """What a lazy import does when Ctrl-C lands while it defines a dataclass: the KeyboardInterrupt
    comes out of a field's __set_name__ (Python 3.11 wraps it in a RuntimeError; 3.12 does not)."""
    class Field:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    class Defined:  # noqa: F841 - defining it is what raises
        field = Field()


def test_ctrl_c_wrapped_by_an_import_ends_a_run_as_ctrl_c_does(tmp_path, monkeypatch, capsys):
    """Hydra reports any Exception out of a job as its failure (a traceback, status 1); a Ctrl-C
    that an import turned into one is still Ctrl-C: one line, status 130, nothing written."""
    from odc_bench import app

    def interrupted_as_it_starts(*args, **kwargs):
        _define_a_class_as_ctrl_c_lands()

    monkeypatch.setattr(app, "run_training", interrupted_as_it_starts)
    monkeypatch.chdir(tmp_path)
    assert odc_bench("backend=sim", f"results_dir={tmp_path / 'results'}") == 130
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("odc_bench: interrupted; "), lines
    assert not (tmp_path / "results").exists()


def test_interrupt_within_finds_ctrl_c_only_among_the_causes():
    ctrl_c = KeyboardInterrupt()
    wrapped = RuntimeError("Error calling __set_name__")
    wrapped.__cause__ = ctrl_c
    outer = ValueError("outer")
    outer.__cause__ = wrapped
    assert interrupt_within(outer) is ctrl_c
    beside = RuntimeError("raised while a Ctrl-C was handled")
    beside.__context__ = ctrl_c  # context, not cause: an error of its own
    assert interrupt_within(beside) is None
    assert interrupt_within(RuntimeError("plain")) is None


def test_a_sweep_with_bad_input_in_a_later_job_stops_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """The command line's first run is fine; its second needs a calibration that is not there.
    Every job is planned before the first runs, so the sweep writes nothing, not even its
    output folder (a sweep file's settings are such later jobs: the command line never shows them)."""
    monkeypatch.chdir(tmp_path)
    before = _files_under(tmp_path)
    assert odc_bench("-m", "backend=sim", "balancer.cost_model=linear,calibrated",
                     f"balancer.calibration={tmp_path / 'none.json'}", f"results_dir={tmp_path / 'results'}") == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("odc_bench: error: ") and "no calibration at" in lines[0], lines
    assert "balancer.cost_model=calibrated" in lines[0], "the line names the job"
    assert _files_under(tmp_path) == before


def test_a_sweep_file_that_cannot_be_read_is_refused_in_one_line_and_blocks_no_other(tmp_path, monkeypatch, capsys):
    """A sweep file that is not YAML, or not a mapping of settings: choosing it is one line and
    exit status 2 with nothing written (it was a traceback); the readable files beside it are
    still offered (every `sweep=NAME` reads the whole folder)."""
    from odc_bench.config import compose as compose_module

    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    (sweeps / "broken_errors_test.yaml").write_text("hydra:\n  sweeper:\n    params: {model: [tiny\n")
    (sweeps / "listed_errors_test.yaml").write_text("- model=tiny\n- model=qwen2_7b\n")
    (sweeps / "fine_errors_test.yaml").write_text("hydra:\n  mode: MULTIRUN\n  sweeper:\n"
                                                  "    params:\n      seed: 3,4\n")
    monkeypatch.setattr(compose_module, "SWEEPS_DIR", sweeps)
    monkeypatch.chdir(tmp_path)
    for name, message in (("broken_errors_test", "broken_errors_test.yaml cannot be read as a config (expected ',' "
                                                 "or ']', but got '<stream end>', line 4, column 1); fix the file"),
                          ("listed_errors_test", "listed_errors_test.yaml holds a list at its top")):
        before = _files_under(tmp_path)
        assert odc_bench(f"sweep={name}", f"results_dir={tmp_path / 'results'}") == 2
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("odc_bench: error: ") and message in lines[0], lines
        assert _files_under(tmp_path) == before
    assert compose_module.compose_config(["sweep=fine_errors_test"], hydra=True).hydra.sweeper.params.seed == "3,4"


@pytest.mark.parametrize("argv,said", [(["x", "--bogus"], "unrecognized arguments: --bogus"),
                                       ([], "the following arguments are required: dirs"),
                                       (["x", "--staleness", "one"], "argument --staleness: invalid int value")])
def test_a_commands_wrong_argument_is_one_line_naming_the_command_as_typed(argv, said, capsys):
    """CommandParser, which every command line of the project parses with: argparse's message in
    one line (not after the whole usage), exit status 2, the command as a user types it."""
    from odc_bench.errors import CommandParser, command_name

    parser = CommandParser(command_name("odc_bench.results.__main__"))
    parser.add_argument("dirs", nargs="+", help="folders")
    parser.add_argument("--staleness", type=int, help="steps behind")
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"python -m odc_bench.results: error: {said}")
    assert err.endswith(" (see python -m odc_bench.results --help)\n")


def test_every_option_says_what_it_takes_and_its_default(capsys):
    """The tools' options had no help at all (`--model MODEL`, `--ranks RANKS`): what a count
    meant, or what it was by default, only the source said."""
    from odc_bench.errors import CommandParser

    parser = CommandParser("python -m some.tool")
    with pytest.raises(TypeError, match="python -m some.tool: argument --ranks has no help text"):
        parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2, help="CPU ranks")
    parser.add_argument("--seed", type=int, default=0, help="the seed")
    parser.add_argument("--out", default=None, help="where it goes")
    parser.add_argument("--plan-cost", default="x", help="the plan's (default: --cost)")
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--steps", default="run-longalign-x0-125-mb8", help="a step " * 12)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "CPU ranks (default: 2)" in flat and "the seed (default: 0)" in flat, "a default of 0 is said too"
    assert "where it goes --plan-cost" in flat and "fewer shapes" in flat and "(default: False)" not in flat
    assert "(default: --cost) (default" not in flat, "a help that says its default is left as it is"
    assert "run-longalign-x0-125-mb8" in out, "names with hyphens are not broken across lines"


def test_every_command_line_of_the_project_parses_with_command_parser():
    """A command that builds argparse's parser itself would print its whole usage before the error."""
    own = [path.relative_to(REPO) for package in ("odc_bench", "odc_core", "paper_figures")
           for path in (REPO / package).rglob("*.py") if "argparse.ArgumentParser(" in path.read_text()]
    assert own == [], own


@pytest.mark.parametrize("argv,said", [
    (["--world-size", "many"], "--world-size: must be an integer of at least 1, got 'many'"),
    (["--minibatch-size", "0"], "--minibatch-size: must be an integer of at least 1, got 0"),
    (["--length-scale", "0"], "--length-scale: must be a number above 0, got 0"),
    (["--staleness", "-1"], "--staleness: must be an integer of at least 0, got -1"),
    (["--packing-ratio", "0.5"], "--packing-ratio: must be a number of at least 1 (the limit over the longest "
                                 "sample, which must fit), got 0.5"),
])
def test_a_tool_run_as_a_module_names_itself_and_its_counts_are_counts(argv, said, capsys):
    """A count of 0 (ranks, samples, steps) was a ZeroDivisionError or an empty max() deep inside."""
    from odc_bench.tools import balancer_report

    with pytest.raises(SystemExit) as stop:
        balancer_report.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"python -m odc_bench.tools.balancer_report: error: argument {said} (see ")


@pytest.mark.parametrize("argv,said", [
    (["--world-size", "99999"], "fewer than one minibatch of --world-size x --minibatch-size = 399996; lower "
                                "--minibatch-size or --world-size"),
    (["--length-scale", "1e300"], "--length-scale 1e+300 makes samples of up to 6.554e+304 tokens"),
    (["--packing-ratio", "1e300"], "(the longest sample x --packing-ratio 1e+300) is beyond what any device holds"),
    (["--num-minibatches", "9999999999999"], "planning --num-minibatches 9999999999999 minibatches of --world-size x "
                                             "--minibatch-size = 32 samples takes at least"),
])
def test_a_tools_sizes_that_cannot_be_planned_are_one_line_naming_its_options(argv, said, capsys):
    """Before, the pool's refusal was a ConfigError traceback, and the sizes past int64 or this
    host's memory an OverflowError's or numpy's allocation error."""
    from odc_bench.tools import balancer_report

    with pytest.raises(SystemExit) as stop:
        balancer_report.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith("python -m odc_bench.tools.balancer_report: error: ") and said in err


@pytest.mark.parametrize("tool,argv,said", [
    ("learnable_curve", ["--min-len", "1", "--max-len", "1"], "argument --min-len: must be at least 2, got 1: a "
                                                              "one-token document has no next token to predict"),
    ("learnable_curve", ["--max-len", "200000"],
     "a step of --docs 4 documents of up to --max-len 200000 tokens would need about"),
    ("sim_bench", ["--stages", "nosuch=1"], "unknown config key 'nosuch'"),
    ("sim_bench", ["--stages", "--ranks", "8", "--minibatches", "99999999999999"],
     "planning --minibatches 99999999999999 minibatches of --ranks x minibatch_size = 32 samples takes at least"),
])
def test_a_side_tools_input_it_cannot_run_is_one_line(tool, argv, said, monkeypatch, capsys):
    """Before: a torch allocation error in the first step, a Hydra error's or a ConfigError's traceback."""
    module = importlib.import_module(f"odc_bench.tools.{tool}")
    monkeypatch.setattr(sys, "argv", [tool, *argv])
    with pytest.raises(SystemExit) as stop:
        module.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"python -m odc_bench.tools.{tool}: error: ") and said in err


@pytest.mark.parametrize("tool,argv,said", [
    ("checkpoint_cost", ["--model", "nope"], "unknown model option 'nope'; choose one of "),
    ("optimizer_step", ["--model", "qwen2_32b"], "a rank would need about "),
])
def test_a_tools_model_is_checked_before_its_ranks_start(tool, argv, said, monkeypatch, capsys):
    """The ranks composed the model themselves: an unknown name was each rank's 80-line traceback
    and exit status 1; a model too large for the host filled its memory."""
    import importlib

    command = importlib.import_module(f"odc_bench.tools.{tool}")
    monkeypatch.setattr(command, "run_ranks", lambda *a, **k: pytest.fail("no rank may start"), raising=False)
    monkeypatch.setattr(command, "mp", None, raising=False)  # optimizer_step spawns through mp.spawn
    with pytest.raises(SystemExit) as stop:
        command.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"python -m odc_bench.tools.{tool}: error: {said}"), err


@pytest.mark.parametrize("kind,text,value", [("positive_int", "3", 3), ("nonnegative_int", "0", 0),
                                             ("positive_float", "0.5", 0.5), ("positive_float", "2", 2.0)])
def test_typed_counts_take_what_they_name(kind, text, value):
    from odc_bench import errors

    assert getattr(errors, kind)(text) == value


@pytest.mark.parametrize("kind,text", [("positive_int", "0"), ("positive_int", "1.5"), ("nonnegative_int", "-1"),
                                       ("positive_float", "0"), ("positive_float", "inf"), ("positive_float", "nan"),
                                       ("positive_float", "-2")])
def test_typed_counts_refuse_what_they_do_not_name(kind, text):
    import argparse

    from odc_bench import errors

    with pytest.raises(argparse.ArgumentTypeError, match="^must be "):
        getattr(errors, kind)(text)


def test_ctrl_c_ends_a_side_command_in_one_line_with_status_130(capsys):
    """A side command's Ctrl-C was a KeyboardInterrupt traceback from wherever it landed."""
    from odc_bench.errors import ends_cleanly

    with pytest.raises(SystemExit) as stop, ends_cleanly("python -m odc_bench.tools.learnable_curve"):
        raise KeyboardInterrupt
    assert stop.value.code == 130
    assert capsys.readouterr().err == "python -m odc_bench.tools.learnable_curve: interrupted\n"
    # One an import wrapped in another error (interrupt_within) is the same Ctrl-C.
    with pytest.raises(SystemExit) as wrapped, ends_cleanly("python -m x"):
        raise RuntimeError("Error calling __set_name__") from KeyboardInterrupt()
    assert wrapped.value.code == 130 and capsys.readouterr().err == "python -m x: interrupted\n"
    # Without a command's name it goes on to the caller: the main app says what its stopped run left.
    with pytest.raises(KeyboardInterrupt), ends_cleanly():
        raise KeyboardInterrupt


@pytest.mark.parametrize("module,argv,said", [
    ("studies.sensitivity", ["table", "--rows", "{t}/none.csv", "--docs", "{t}/s.md"],
     "--rows {t}/none.csv: no such file; `python -m odc_bench.studies.sensitivity run` writes it"),
    ("studies.paper", ["table", "--results-dir", "{t}/none", "--docs", "{t}/p.md"],
     "--results-dir {t}/none holds no runs.csv; `python -m odc_bench.studies.paper run` writes it"),
    ("studies.published", ["--points", "{t}/none.csv", "--out", "{t}/o", "--doc", "{t}/d.md"],
     "argument --points: {t}/none.csv: no such file"),
    ("studies.published", ["--doc-only", "--out", "{t}/o", "--doc", "{t}/d.md"],
     "--doc-only: {t}/o lacks gpu-points.csv, gpu-ratios.csv, "),
    ("studies.validation", ["--doc-only", "--out", "{t}/o", "--docs", "{t}/v.md"],
     "--doc-only: {t}/o lacks sim-cpu.csv, sim-cpu-provenance.json; run "),
    ("studies.validation", ["--only", "longalign", "--out", "{t}/o", "--results-dir", "{t}/r", "--docs", "{t}/v.md"],
     "argument --only: invalid choice: 'longalign' (choose from 'longalign mb1', "),
    ("calibrate.cpu_profile", ["--results-dir", "{t}/r", "--out", "{t}/c.json", "model=nope"],
     "unknown model option 'nope'"),
    ("calibrate.cpu_profile", ["--results-dir", "{t}/r", "--out", "{t}/c.json", "backend.recompute=true"],
     "the CPU profile is fitted on runs without activation checkpointing, which the simulator adds to it"),
    ("calibrate.cpu_profile", ["--results-dir", "{t}/r", "--out", "{t}/c.json", "device=cuda"],
     "the CPU profile is fitted on this machine's CPU ranks (backend/hardware=cpu simulates them): drop device=cuda"),
    ("calibrate.cpu_profile", ["--results-dir", "{t}/r", "--out", "{t}/c.json", "world_size=-1"],
     "world_size must be at least 1, got -1"),
    ("calibrate.cpu_profile", ["--results-dir", "{t}/r", "--out", "{t}/c.json", "model=0"],
     "model=0 names no model option (Hydra reads 0 as a number; "),
    ("calibrate.cpu_profile", ["--results-dir", "{t}/r", "--out", "", "model=tiny"],
     "argument --out: an empty path; give a file's path"),
    ("calibrate.cost_model", ["model=true"], "model=true names no model option (Hydra reads true as a boolean; "),
    ("studies.staleness", ["{t}/none"], "no such folder or table: {t}/none"),
    ("studies.staleness", ["{t}", "--simulate", ""], "argument --simulate: an empty path"),
    # Inputs of another kind (in/: a two-column CSV, an empty file, a results table of no run)
    # were a KeyError's traceback, the published points' after simulating those it could read.
    ("studies.published", ["--points", "{t}/in/other.csv", "--out", "{t}/o", "--doc", "{t}/d.md"],
     "--points {t}/in/other.csv lacks the columns point_id, source_id, source_title, source_url and 30 more of "
     "results/published/points.csv"),
    ("studies.published", ["--points", "{t}/in/empty.csv", "--out", "{t}/o", "--doc", "{t}/d.md"],
     "--points {t}/in/empty.csv is not a CSV table (No columns to parse from file)"),
    ("studies.sensitivity", ["table", "--rows", "{t}/in/other.csv", "--docs", "{t}/s.md"],
     "--rows {t}/in/other.csv lacks study, label, key, seed and 9 more, so it is not the rows "),
    ("studies.sensitivity", ["run", "--rows", "{t}/in/other.csv"], "--rows {t}/in/other.csv lacks study, label, key"),
    ("studies.paper", ["table", "--results-dir", "{t}/in", "--docs", "{t}/p.md"],
     "--results-dir {t}/in's runs.csv holds no successful simulated run of the sweeps fig8_sft, fig10, fig9_rl; "
     "`python -m odc_bench.studies.paper run` writes them"),
])
def test_a_studys_missing_input_is_one_line_before_any_work(module, argv, said, tmp_path, capsys):
    """Each was a FileNotFoundError's or Hydra's traceback, once its work reached the input; the
    paper's table wrote a page of empty tables from a folder without rows, or of no run."""
    import importlib

    from odc_bench.record.schema import COLUMNS

    given = tmp_path / "in"
    given.mkdir()
    inputs = {"other.csv": "a,b\n1,2\n", "empty.csv": "", "runs.csv": ",".join(COLUMNS) + "\n"}
    for name, text in inputs.items():
        (given / name).write_text(text)
    command = importlib.import_module(f"odc_bench.{module}")
    with pytest.raises(SystemExit) as stop:
        command.main([a.format(t=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"python -m odc_bench.{module}: error: {said.format(t=tmp_path)}"), err
    assert [p.name for p in tmp_path.iterdir()] == ["in"], "nothing written"
    assert {p.name: p.read_text() for p in given.iterdir()} == inputs


@pytest.mark.slow
def test_a_full_results_folder_ends_the_command_in_one_line_and_leaves_no_partial_file(tmpfs, tmp_path):
    """A run's trace or a figure written into a full file system was a traceback (the run's
    Hydra's, paper_figures' own), and paper_figures left the figure it was writing cut short."""
    full = tmpfs("8k")
    env = dict(os.environ, PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0")
    for argv, said in [
        (["odc_bench", "backend=sim", f"results_dir={full}/r"], f"odc_bench: error: cannot write {full}/r/traces/"),
        (["paper_figures", "--results", str(REPO / "results"), "--out", f"{full}/f", "--only", "fig11_bandwidth"],
         f"python -m paper_figures: error: cannot write {full}/f/fig11_bandwidth"),
    ]:
        proc = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.splitlines()[-1]
        assert last.startswith(said) and last.endswith("; free some space or write elsewhere"), proc.stderr
        assert "Traceback" not in proc.stderr
    assert [p for p in full.rglob("*") if p.is_file()] == [], "no file cut short, no temporary"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_a_side_command_in_one_line_once_and_restore_the_handlers(signum, capsys):
    """Their default actions ended a side command on the spot: ranks it ran (checkpoint_cost,
    optimizer_step, the primitives) left their shared memory until another run swept it."""
    from odc_bench.errors import ends_cleanly

    original = signal.signal(signum, signal.SIG_DFL)  # as a terminal starts a command, whatever runs this test
    try:
        with pytest.raises(SystemExit) as stop, ends_cleanly("python -m outer"), ends_cleanly("python -m inner"):
            signal.raise_signal(signum)
        assert stop.value.code == 128 + signum
        assert capsys.readouterr().err == f"python -m inner: stopped by {signal.Signals(signum).name}\n"
        assert signal.getsignal(signum) == signal.SIG_DFL
        signal.signal(signum, signal.SIG_IGN)  # started under nohup: left ignored
        with ends_cleanly("python -m x"):
            assert signal.getsignal(signum) == signal.SIG_IGN
    finally:
        signal.signal(signum, original)



def test_a_path_option_no_file_system_can_hold_is_refused_in_one_line(tmp_path, capsys):
    """A side command's first look at such a path was an OSError's traceback (File name too long)."""
    from odc_bench.errors import CommandParser

    parser = CommandParser(prog="python -m x")
    parser.add_argument("--rows", type=Path, help="a table")
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--rows", str(tmp_path / ("n" * 300) / "rows.csv")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m x: error: argument --rows: ") and len(err.splitlines()) == 1
    assert "...: a name in it is longer than its file system takes" in err
    assert parser.parse_args(["--rows", str(tmp_path / "missing.csv")]).rows == tmp_path / "missing.csv"


def test_a_command_writes_what_its_stdout_cannot_encode_escaped(monkeypatch):
    """A path's é on a latin-1 or ASCII terminal, or a file name's bytes that are not UTF-8, ended
    the what-if's report in a UnicodeEncodeError."""
    import io

    from odc_bench.errors import ends_cleanly

    for encoding, text, written in [("ascii", "/tmp/josé/l.jsonl", b"/tmp/jos\\xe9/l.jsonl"),
                                    ("utf-8", "/tmp/bad\udcff.jsonl", b"/tmp/bad\\udcff.jsonl")]:
        out = io.BytesIO()
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding=encoding))
        with ends_cleanly("python -m x"):
            print(text)
        assert out.getvalue() == written + b"\n"


@pytest.mark.parametrize("env,said", [({"TORCHELASTIC_RUN_ID": "r", "WORLD_SIZE": "2"}, "torchrun (WORLD_SIZE=2)"),
                                      ({"SLURM_STEP_NUM_TASKS": "8"}, "srun (SLURM_STEP_NUM_TASKS=8)"),
                                      ({"OMPI_COMM_WORLD_SIZE": "4"}, "mpirun (OMPI_COMM_WORLD_SIZE=4)"),
                                      ({"PMI_SIZE": "2"}, "mpiexec (PMI_SIZE=2)")])
def test_a_command_started_once_per_rank_is_refused_in_one_line(env, said, tmp_path, monkeypatch, capsys):
    """`torchrun --nproc_per_node 2 -m odc_bench` ran the whole command in each copy: the copies
    raced for every run."""
    from odc_bench.cli import started_per_rank

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    assert odc_bench("backend=sim", f"results_dir={tmp_path / 'r'}") == 2
    assert capsys.readouterr().err == (f"odc_bench: error: this command was started once per rank, by {said}, but it "
                                       f"starts a run's ranks itself (world_size); start it once: python -m odc_bench "
                                       f"... (on SLURM: hydra/launcher=slurm, or srun -n 1)\n")
    assert list(tmp_path.iterdir()) == []
    # Started once: a step of one task, a WORLD_SIZE someone exported, a batch script's own shell.
    assert started_per_rank({"SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "8", "WORLD_SIZE": "4"}) is None


def test_a_sweep_chosen_where_there_are_no_sweep_files_says_where_they_are(tmp_path, monkeypatch, capsys):
    """An installed wheel carries no sweeps/ folder: `sweep=smoke` said "unknown config key 'sweep'"."""
    from odc_bench.config import compose as compose_module

    monkeypatch.setattr(compose_module, "SWEEPS_DIR", tmp_path / "sweeps")
    monkeypatch.chdir(tmp_path)
    assert odc_bench("sweep=smoke", f"results_dir={tmp_path / 'results'}") == 2
    assert capsys.readouterr().err == (
        f"odc_bench: error: sweep=smoke: there are no sweep files in {tmp_path / 'sweeps'} (the repository's "
        f"sweeps/ folder, which an installed odc-bench does not carry); run from a checkout of the repository, or "
        f"set ODC_SWEEPS_DIR to a folder of sweep files\n")
    assert list(tmp_path.iterdir()) == []
    # A folder of the user's, named by ODC_SWEEPS_DIR, is not the repository's.
    monkeypatch.setenv("ODC_SWEEPS_DIR", str(tmp_path / "mine"))
    monkeypatch.setattr(compose_module, "SWEEPS_DIR", tmp_path / "mine")
    assert odc_bench("sweep=smoke", f"results_dir={tmp_path / 'results'}") == 2
    assert capsys.readouterr().err == (
        f"odc_bench: error: sweep=smoke: there are no sweep files in ODC_SWEEPS_DIR={tmp_path / 'mine'}; set it to a "
        f"folder of sweep files (NAME.yaml, as the repository's sweeps/ holds them), or unset it for the "
        f"repository's\n")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_given_by_its_path_or_without_its_package_line_is_one_line_saying_how_to_run_it(tmp_path,
                                                                                                   monkeypatch, capsys):
    """`sweep=./pathsweep.yaml` said "unknown sweep/. option 'pathsweep.yaml'", and a sweep file of a user's
    config folder without `# @package _global_` "unknown config key 'sweep'"; the ways each line
    names run the sweep."""
    sweep_file = "hydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n      seed: 0,1\n"
    (tmp_path / "pathsweep.yaml").write_text(sweep_file)
    (tmp_path / "conf" / "sweep").mkdir(parents=True)
    (tmp_path / "conf" / "sweep" / "pathsweep.yaml").write_text(sweep_file)
    monkeypatch.chdir(tmp_path)
    results = (f"results_dir={tmp_path / 'r'}", "backend=sim", "num_minibatches=2", "warmup_minibatches=0")
    assert odc_bench("sweep=./pathsweep.yaml", *results) == 2
    assert capsys.readouterr().err == (
        f"odc_bench: error: sweep=./pathsweep.yaml: a sweep is chosen by its file's name, not its path: run it as "
        f"ODC_SWEEPS_DIR={tmp_path} python -m odc_bench sweep=pathsweep (ODC_SWEEPS_DIR: a folder of sweep files; "
        f"docs/sweeps.md)\n")
    assert odc_bench("--config-dir", str(tmp_path / "conf"), "sweep=pathsweep", *results) == 2
    assert capsys.readouterr().err.startswith("odc_bench: error: a sweep file's settings came under a key `sweep`: "
                                              "a sweep of your config folder (DIR/sweep/NAME.yaml) sets keys of the "
                                              "whole config")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf", "pathsweep.yaml"], "nothing written"
    # The package line added: the config folder's sweep runs; then the file beside, by its folder.
    (tmp_path / "conf" / "sweep" / "pathsweep.yaml").write_text("# @package _global_\n" + sweep_file)
    assert odc_bench("--config-dir", str(tmp_path / "conf"), "sweep=pathsweep", *results,
                     f"hydra.sweep.dir={tmp_path / 'm'}") == 0
    from odc_bench.config import compose as compose_module

    monkeypatch.setenv("ODC_SWEEPS_DIR", str(tmp_path))
    monkeypatch.setattr(compose_module, "SWEEPS_DIR", tmp_path)
    assert odc_bench("sweep=pathsweep", *results, f"hydra.sweep.dir={tmp_path / 'm2'}") == 0
    assert len(read_table(tmp_path / "r" / "runs.csv")) == 2, "the second sweep resumed the first one's two runs"


def test_local_ranks_started_without_the_commands_check_meet_the_same_refusal(tmp_path, monkeypatch):
    """The calibration and the studies start ranks with run_local, past the command's check: a
    TMPDIR too long for the fork server's socket is refused there too, and leaves nothing in it."""
    from odc_bench.run.local import run_local
    from tests.helpers import run_spec

    folder = Path(_long_tmpdir(tmp_path)["TMPDIR"])
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    with pytest.raises(ConfigError, match="is too long for the socket that starts the local ranks"):
        run_local(run_spec("world_size=2", "num_minibatches=2", "warmup_minibatches=1"))
    assert list(folder.iterdir()) == []


def test_a_refusal_quoting_a_multi_line_error_stays_one_line(tmp_path, capsys):
    """pandas' parser errors end in a newline: a timings file that is not a CSV of its columns was
    refused over two lines, its ")" alone on the second."""
    from odc_bench.calibrate import cost_model

    timings = tmp_path / "timings.csv"
    timings.write_bytes(b"model\nqwen2_1p5b\nqwen2_1p5b,layer\n")
    with pytest.raises(SystemExit) as ended:
        cost_model.main(["--timings", str(timings), "--out", str(tmp_path / "c.json"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("python -m odc_bench.calibrate.cost_model: error: cannot read unit timings ")
    assert err.endswith("saw 2)\n") and not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("argv,said", [
    (["", "--model", "qwen2_7b"], "argument lengths: an empty path; give a length profile or a file or folder"),
    (["examples/lengths.jsonl", "--model", ""], "argument --model: empty; give a name or a path"),
    (["examples/lengths.jsonl", "--hardware", " "], "argument --hardware: empty; give a name or a path"),
])
def test_the_what_ifs_empty_input_is_one_line(argv, said, tmp_path, capsys):
    """An empty lengths path was the working folder, which datasets then failed to load ("cannot
    load . with datasets")."""
    from odc_bench.whatif.cli import main

    with pytest.raises(SystemExit) as stop:
        main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"python -m odc_bench.whatif: error: {said}"), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cost,said", [
    ("quadratic:13b", "no quadratic fit '13b'; choose one of quadratic:1p5b, quadratic:7b"),
    ("nowhere.json", "nowhere.json: no such file; give linear, quadratic:FIT or a file"),
    (" ", "an empty cost model; give linear"),
    ("{folder}", ": a folder, not a file; give linear"),
    ("{bad}", "is not a calibration file (KeyError"),
])
@pytest.mark.parametrize("option", ["--cost", "--plan-cost"])
def test_the_balancer_reports_cost_model_is_one_line_naming_what_it_takes(option, cost, said, tmp_path, capsys):
    """An unknown fit was a KeyError's traceback, a missing file a FileNotFoundError's, and a file
    that is no calibration a ValueError's, each after the command had started."""
    from odc_bench.tools import balancer_report

    (tmp_path / "bad.json").write_text('{"a": 1}')
    with pytest.raises(SystemExit) as stop:
        balancer_report.main([option, cost.format(folder=tmp_path, bad=tmp_path / "bad.json")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"python -m odc_bench.tools.balancer_report: error: argument {option}: ") and said in err
