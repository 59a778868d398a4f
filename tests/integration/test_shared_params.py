"""Tied input/output embeddings under FSDP2: the units sharing the parameter fall to the root."""

import pytest

from odc_bench.errors import ConfigError
from odc_bench.plan.spec import resolve
from odc_bench.run.local import run_local
from tests.helpers import run_config
from tests.helpers.reference import relative_error, train_single_process

pytestmark = pytest.mark.slow


def test_fsdp2_with_tied_embeddings_matches_a_single_process():
    spec = resolve(run_config("engine=collective", "model.num_layers=1", "model.tie_embeddings=true", "world_size=2",
                              "minibatch_size=2", "warmup_minibatches=0", "num_minibatches=2",
                              "dataset.length_scale=0.005"))
    params = run_local(spec, collect_params=True)[0]["params"]
    reference, _ = train_single_process(spec)
    assert relative_error(params, reference) < 1e-5


def test_odc_with_tied_embeddings_is_refused_before_any_rank_starts():
    with pytest.raises(ConfigError, match="engine=odc does not support model.tie_embeddings=true"):
        resolve(run_config("engine=odc", "model.tie_embeddings=true"))
