from pathlib import Path

import pytest

from odc_bench.config import ConfigError, resolve
from odc_core.engine import ENGINES
from tests.conftest import compose_config, run_cli

CONF = Path(__file__).resolve().parents[1] / "odc_bench" / "conf"
GROUP_OPTIONS = [(g.name, f.stem) for g in sorted(CONF.iterdir()) if g.is_dir() and g.name != "__pycache__"
                 for f in sorted(g.glob("*.yaml"))]


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_config_group_option_composes_and_resolves(group, option):
    # An engine the simulator models before its real implementation is installed runs there.
    sim_only = group == "engine" and option not in ENGINES
    cfg = compose_config(f"{group}={option}", "num_minibatches=2", "warmup_minibatches=0",
                         *(["backend=sim"] if sim_only else []))
    spec = resolve(cfg)
    assert spec.config[group]["name"] == option
    assert len(spec.minibatches) == 2


def test_default_job_is_the_documented_one():
    spec = resolve(compose_config())
    c = spec.config
    assert (c["model"]["name"], c["world_size"], c["dataset"]["profile"]) == ("tiny", 2, "longalign")
    assert c["dataset"]["length_scale"] < 1
    assert all(len(mb.lengths) == c["world_size"] * c["minibatch_size"] for mb in spec.minibatches)


def test_resolve_is_deterministic():
    a, b = resolve(compose_config()), resolve(compose_config())
    assert a.run_id == b.run_id
    assert [(m.sample_ids, m.plan) for m in a.minibatches] == [(m.sample_ids, m.plan) for m in b.minibatches]


@pytest.mark.parametrize(("override", "message"), [
    ("world_size=0", "world_size must be at least 1"),
    ("minibatch_size=0", "minibatch_size must be at least 1"),
    ("max_tokens=64", "over the microbatch limit max_tokens=64"),
    ("dataset.profile=nosuch", "unknown dataset profile 'nosuch'"),
])
def test_bad_input_is_a_config_error(override, message):
    with pytest.raises(ConfigError, match=message):
        resolve(compose_config(override))


@pytest.mark.parametrize("override", ["world_size=0", "minibatch_size=0", "max_tokens=64",
                                      "dataset.profile=nosuch"])
def test_bad_input_exits_2_with_one_line_and_no_row(override, results_dir):
    proc = run_cli(override, f"results_dir={results_dir}")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("odc_bench: error: "), proc.stderr
    assert not (results_dir / "runs.csv").exists()
