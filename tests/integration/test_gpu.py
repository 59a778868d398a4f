"""Runs on a CUDA device when one is present; everywhere else these skip, saying why."""

import pytest
import torch

from odc_bench.errors import ConfigError
from odc_bench.plan.spec import resolve
from odc_bench.run.local import run_local
from tests.helpers import run_config

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device on this machine: GPU runs are checked on the lent GPU machine")


@needs_gpu
@pytest.mark.gpu
def test_collective_engine_trains_on_one_gpu_with_nccl():
    spec = resolve(run_config("device=cuda", "world_size=1", "num_minibatches=2", "warmup_minibatches=0"))
    result = run_local(spec)[0]
    assert any(e["kind"] == "bwd" for e in result["events"])
    assert result["peak_bytes"] > 0


@needs_gpu
@pytest.mark.gpu
def test_odc_on_cuda_is_refused_until_a_cuda_transport_exists():
    with pytest.raises(ConfigError, match="engine=odc has no CUDA transport"):
        resolve(run_config("device=cuda", "engine=odc"))
