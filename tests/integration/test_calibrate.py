import json
import subprocess
import sys

import pytest

from odc_bench.balancers.cost import CALIBRATION_UNIT
from odc_bench.calibrate.cost_model import fit_nonnegative, microbatch_shapes
from odc_bench.plan.spec import resolve
from tests.helpers import run_config


def _seconds(shapes, a, b, c):
    return [a * sum((n / CALIBRATION_UNIT) ** 2 for n in s) + b * sum(n / CALIBRATION_UNIT for n in s) + c
            for s in shapes]


def test_fit_recovers_known_coefficients():
    shapes = microbatch_shapes(4096)
    a, b, c = fit_nonnegative(shapes, _seconds(shapes, 0.25, 0.04, 0.003))
    assert (a, b, c) == pytest.approx((0.25, 0.04, 0.003), rel=1e-6)


def test_fit_keeps_coefficients_non_negative():
    shapes = microbatch_shapes(4096)
    # timings that an unconstrained fit would explain with a negative intercept
    a, b, c = fit_nonnegative(shapes, _seconds(shapes, 0.3, 0.05, -0.02))
    assert min(a, b, c) >= 0 and c == 0


def test_shapes_cover_singles_and_packs_up_to_max_tokens():
    shapes = microbatch_shapes(1024)
    assert max(sum(s) for s in shapes) <= 1024
    assert [1024] in shapes and any(len(s) > 1 for s in shapes)


@pytest.mark.slow
def test_calibrate_writes_coefficients_with_provenance_that_runs_load(tmp_path):
    out = tmp_path / "cal" / "tiny-test.json"
    proc = subprocess.run([sys.executable, "-m", "odc_bench.calibrate.cost_model", "max_tokens=192",
                           f"balancer.calibration={out}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout
    data = json.loads(out.read_text())
    assert data["model"] == "tiny" and data["device"] == "cpu" and data["unit"] == CALIBRATION_UNIT
    assert min(data["a"], data["b"], data["c"]) >= 0 and data["a"] + data["b"] > 0
    prov = data["provenance"]
    assert {"host", "date", "commit", "command", "torch", "threads"} <= set(prov)
    assert "balancer.calibration" in prov["command"]
    assert len(data["timings"]) == len(microbatch_shapes(192))
    assert all(len(t["seconds"]) == 5 and t["median"] > 0 for t in data["timings"])
    assert not list(out.parent.glob(".*.tmp")), "written atomically, no temporary left"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal"], "nothing but the calibration"
    spec = resolve(run_config("balancer=lb_micro", "balancer.cost_model=calibrated",
                                  f"balancer.calibration={out}", "max_tokens=192", "dataset.length_scale=0.002",
                                  "num_minibatches=1", "warmup_minibatches=0"))
    assert spec.cost_model.label == "calibrated:tiny-test"


@pytest.mark.slow
def test_a_bad_command_line_is_one_line_with_status_2_and_writes_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "odc_bench.calibrate.cost_model", "--unit-models=qwen2_7b",
                           "model=tiny", "device=cpu", f"balancer.calibration={tmp_path / 'cal.json'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "--unit-models times units with CUDA events" in proc.stderr
    assert list(tmp_path.iterdir()) == [], "not even Hydra's output folder"
