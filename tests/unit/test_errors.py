"""Every bad input listed in docs/errors.md is refused in one line before anything is written.

The cases run in-process through `odc_bench.cli.precheck`, the check `python -m odc_bench`
makes before Hydra starts; a few also run as real command lines for the exit status.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from odc_bench.cli.precheck import precheck
from odc_bench.errors import ConfigError
from odc_bench.record.row import COLUMNS, SCHEMA_VERSION
from tests.helpers import REPO

ERRORS_DOC = REPO / "docs" / "errors.md"


def _jsonl(text: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / "d.jsonl").write_text(text)


def _runs_csv(text: str | None) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "results").mkdir()
        if text is None:
            (tmp / "results" / "runs.csv").mkdir()
        else:
            (tmp / "results" / "runs.csv").write_text(text)
    return setup


def _file(tmp: Path) -> None:
    (tmp / "file").write_text("not a folder\n")


def _empty_dir(tmp: Path) -> None:
    (tmp / "not_a_dataset").mkdir()


HEADER = ",".join(COLUMNS)
OTHER_VERSION = SCHEMA_VERSION + 1
ROW_OTHER = ",".join(str(OTHER_VERSION) if c == "schema_version" else "x" for c in COLUMNS)

# case -> (command line, the message it must give, set-up of the files it names)
TWO_NODES = ["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1"]

CASES: dict[str, tuple[list[str], str, Callable[[Path], None] | None]] = {
    # the command line
    "unknown-key": (["no_such_key=1"], "unknown config key 'no_such_key'; check its spelling", None),
    "added-key": (["+no_such_key=1"], "unknown config key 'no_such_key' (added by '+no_such_key=1')", None),
    "added-option": (["balancer=lb_mini", "engine=odc", "+balancer.options.nosuch=1"],
                     "unknown config key 'balancer.options.nosuch'", None),
    "unknown-option": (["engine=nosuch"], "unknown engine option 'nosuch'; choose one of collective, odc", None),
    "unknown-task": (["task=nosuch"], "unknown task option 'nosuch'", None),
    "malformed-override": (["world_size=[1,"], "no viable alternative at input '[1,'", None),
    "sweep-without-multirun": (["world_size=1,2"], "'world_size=1,2' lists several values; add --multirun", None),
    # values
    "world-size-zero": (["world_size=0"], "world_size must be at least 1, got 0", None),
    "not-an-integer": (["minibatch_size=2.5"], "minibatch_size must be an integer, got 2.5", None),
    "negative-seed": (["seed=-1"], "seed must be at least 0", None),
    "warmup-too-long": (["num_minibatches=2", "warmup_minibatches=2"],
                        "warmup_minibatches (2) must be below num_minibatches (2)", None),
    "bad-precision": (["precision=fp16"], "precision must be one of fp32, bf16, got 'fp16'", None),
    "bad-timeout": (["timeout_s=0"], "timeout_s must be a positive number of seconds, got 0", None),
    "bad-deadline": (["deadline_s=-5"], "deadline_s must be a positive number of seconds or null", None),
    "bad-device": (["device=tpu"], "device must be one of auto, cpu, cuda, got 'tpu'", None),
    "no-cuda": (["device=cuda"], "device=cuda but no CUDA device is visible", None),
    "bad-threads": (["threads_per_rank=0"], "threads_per_rank must be null or a positive integer", None),
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
    # combinations that cannot run
    "lb-mini-on-collective": (["balancer=lb_mini"], "balancer lb_mini gives ranks different microbatch counts, "
                              "which engine=collective cannot run", None),
    "dynamic-on-collective": (["balancer=dynamic"], "balancer dynamic gives ranks different microbatch counts", None),
    "dynamic-with-staleness": (["engine=odc", "engine.staleness=1", "balancer=dynamic"],
                               "balancer dynamic hands out work from one counter", None),
    "negative-staleness": (["engine=odc", "engine.staleness=-1"], "engine.staleness must be an integer >= 0, got -1",
                           None),
    # sizes that must divide or fit
    "heads-do-not-divide": (["model.num_heads=3"], "hidden_size 128 must divide by num_heads 3", None),
    "slurm-nodes-do-not-divide": (["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "world_size=3"],
                                  "hydra.launcher.nodes (2) x tasks_per_node (3) must equal world_size (3)", None),
    "slurm-tasks-per-node": (["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "world_size=4"],
                             "set hydra.launcher.tasks_per_node=2", None),
    "slurm-odc-across-nodes": ([*TWO_NODES, "engine=odc"],
                               "engine=odc on transport shm keeps its symmetric heap in POSIX shared memory "
                               "(/dev/shm) on one host, which cannot span hydra.launcher.nodes=2; "
                               "set hydra.launcher.nodes=1", None),
    "slurm-shm-across-nodes": (TWO_NODES,
                               "engine.backend=shm (the CPU default) runs FSDP2 over shared memory, which cannot span "
                               "hydra.launcher.nodes=2; set engine.backend=gloo", None),
    "slurm-gpus-without-cuda": (["-m", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=2"],
                                "hydra.launcher.gpus_per_node asks for GPUs, but runs are resolved on this machine",
                                None),
    "pool-smaller-than-minibatch": (["dataset.num_samples=3"],
                                    "the dataset has 3 usable samples, fewer than one minibatch", None),
    "sample-over-max-tokens": (["max_tokens=64"], "over the microbatch limit max_tokens=64", None),
    # data
    "unknown-profile": (["dataset.profile=nosuch"], "unknown dataset profile 'nosuch'", None),
    "data-path-unset": (["dataset=jsonl"], "dataset=jsonl needs dataset.path", None),
    "data-file-missing": (["dataset=jsonl", "dataset.path={tmp}/missing.jsonl"], "missing.jsonl does not exist", None),
    "data-not-json": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"], "d.jsonl line 2 is not valid JSON",
                      _jsonl("120\n{oops\n")),
    "data-object-without-field": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"],
                                  "line 1 is an object; set dataset.field", _jsonl('{"n": 5}\n')),
    "data-negative-length": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"], "negative token count -4",
                             _jsonl("12\n-4\n")),
    "data-no-usable-sample": (["dataset=jsonl", "dataset.path={tmp}/d.jsonl"], "has no sample of at least 2 tokens",
                              _jsonl("1\n0\n")),
    "hf-disk-not-a-dataset": (["dataset=hf_disk", "dataset.path={tmp}/not_a_dataset"],
                              "with datasets.load_from_disk", _empty_dir),
    # the results folder
    "results-dir-is-a-file": (["results_dir={tmp}/file"], "file is not a directory; set results_dir to a folder",
                              _file),
    "results-dir-under-a-file": (["results_dir={tmp}/file/sub"], "cannot be created", _file),
    "runs-csv-is-a-folder": ([], "runs.csv is not a file", _runs_csv(None)),
    "runs-csv-other-columns": ([], f"does not have the columns of results schema version {SCHEMA_VERSION} (missing ",
                               _runs_csv("run_id,status,samples_per_s\nabc,ok,1.0\n")),
    "runs-csv-other-schema-version": ([], f"holds rows of schema_version {OTHER_VERSION}, this code writes "
                                          f"{SCHEMA_VERSION}", _runs_csv(f"{HEADER}\n{ROW_OTHER}\n")),
    "runs-csv-not-csv": ([], "is not a readable results table", _runs_csv('a,b\n"unterminated\n')),
}


def _files_under(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")} if folder.is_dir() else {}


def _argv(case: str, tmp: Path) -> list[str]:
    overrides, _, setup = CASES[case]
    if setup is not None:
        setup(tmp)
    argv = [o.format(tmp=tmp) for o in overrides]
    if not any(a.startswith("results_dir=") for a in argv):
        argv.append(f"results_dir={tmp / 'results'}")
    return argv


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_in_one_line_and_writes_nothing(case, tmp_path):
    if case == "no-cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here, so device=cuda is valid input")
    argv = _argv(case, tmp_path)
    before = _files_under(tmp_path / "results")
    with pytest.raises(ConfigError) as error:
        precheck(argv)
    message = str(error.value)
    assert CASES[case][1] in message
    assert "\n" not in message, "one line"
    assert _files_under(tmp_path / "results") == before, "nothing written into the results folder"


def test_docs_list_exactly_the_cases_tested():
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", ERRORS_DOC.read_text(), flags=re.MULTILINE)
    assert len(documented) == len(set(documented)), "each case once"
    assert set(documented) == set(CASES)
    assert len(CASES) >= 15


@pytest.mark.slow
@pytest.mark.parametrize("case", ["added-key", "lb-mini-on-collective", "data-not-json",
                                  "runs-csv-other-schema-version"])
def test_the_command_line_exits_2_with_one_line_and_leaves_nothing_behind(case, tmp_path):
    argv = _argv(case, tmp_path)
    before = _files_under(tmp_path / "results")
    env = dict(os.environ, PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0")
    proc = subprocess.run([sys.executable, "-m", "odc_bench", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("odc_bench: error: ") and CASES[case][1] in lines[0], proc.stderr
    assert _files_under(tmp_path / "results") == before
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists(), "no Hydra output folder"
