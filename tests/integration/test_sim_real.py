"""The simulator against real CPU runs: the same events, and a small version of the validation.

The full validation (more configs, both engines, the table in docs/simulator_validation.md)
is `python -m odc_bench.studies.validation`; these runs are short, and this machine is shared, so
the out-of-sample bound here is loose.
"""

import json

import pandas as pd
import pytest

from odc_bench.calibrate.cpu_profile import fit
from odc_bench.jobs.train import execute
from odc_bench.plan.spec import resolve
from odc_bench.record.row import timing
from odc_bench.record.schema import COLUMNS
from odc_bench.sim.events import KIND_NAMES
from odc_bench.sim.hardware import unit_shape
from tests.helpers import run_config, skip_if_overloaded

# The whole module is `timing`: its calibration run, shared by every test here, is measured.
pytestmark = [pytest.mark.slow, pytest.mark.timing]

BASE = ("num_minibatches=5", "warmup_minibatches=1", "minibatch_size=2", "threads_per_rank=1")


def real_run(tmp, *overrides):
    spec = resolve(run_config(*BASE, *overrides, f"results_dir={tmp}"))
    row = execute(spec, tmp)
    assert row["status"] == "ok", row["error"]
    return spec, row, pd.read_csv(tmp / row["trace"])


@pytest.fixture(scope="module")
def calibration_run(tmp_path_factory):
    return real_run(tmp_path_factory.mktemp("real"), "dataset=longalign")


def sim_run(tmp, calibration, *overrides):
    spec = resolve(run_config(*BASE, *overrides, "backend=sim", "backend/hardware=cpu",
                                  f"backend.hardware.calibration={calibration}", f"results_dir={tmp}"))
    row = execute(spec, tmp)
    return spec, row, pd.read_csv(tmp / row["trace"])


def fitted(tmp, spec, events):
    """A CPU profile fitted on one collective run, as a calibration file."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "sim-tiny-cpu.json"
    path.write_text(json.dumps(fit({"collective": [(spec, events)]})))
    return path


@pytest.fixture(scope="module")
def calibration(calibration_run, tmp_path_factory):
    return fitted(tmp_path_factory.mktemp("cal"), *calibration_run[::2])


def test_simulated_runs_write_the_same_events_and_row_as_real_ones(calibration_run, calibration, tmp_path):
    _, real_row, real = calibration_run
    sim_spec, sim_row, sim = sim_run(tmp_path, calibration, "dataset=longalign")
    assert list(sim.columns) == list(real.columns)
    assert set(real["kind"]) - set(KIND_NAMES) == {"gc"}, "the only real events not simulated are the harness's"
    real = real[real["kind"] != "gc"]
    key = ["rank", "minibatch", "microbatch", "kind", "unit"]
    assert sorted(map(tuple, sim[key].fillna("").astype(str).values)) == \
        sorted(map(tuple, real[key].fillna("").astype(str).values))
    assert list(pd.read_csv(tmp_path / "runs.csv").columns) == COLUMNS
    assert sim_row["backend"] == "sim" and real_row["backend"] == "local"
    fitted_on = json.loads(calibration.read_text())
    assert (fitted_on["precision"], fitted_on["shape"], fitted_on["threads"]) == \
        ("fp32", unit_shape(sim_spec.config.model), 1), \
        "what a simulated run on the profile is checked against"


def test_the_fitted_profile_reproduces_its_own_calibration_run(calibration_run, calibration, tmp_path):
    """The fit holds a unit's typical time, not the host's hiccups, so one hiccup inside the
    5-second run leaves the run slower than its own fit (in CI, once, by 10.2%); a model error
    repeats and a hiccup rarely does, so a miss is measured once more on a fresh run."""
    spec, _, events = calibration_run
    for attempt in range(2):
        if attempt:
            spec, _, events = real_run(tmp_path / "calibration", "dataset=longalign")
            calibration = fitted(tmp_path / "fit", spec, events)
        measured = timing(spec, events)
        _, predicted, _ = sim_run(tmp_path / f"sim{attempt}", calibration, "dataset=longalign")
        if reproduced := (predicted["samples_per_s"] == pytest.approx(measured["samples_per_s"], rel=0.10)
                          and predicted["bubble_rate"] == pytest.approx(measured["bubble_rate"], abs=0.08)):
            break
    assert reproduced, (f"predicted {predicted['samples_per_s']:.2f} samples/s at bubble rate "
                        f"{predicted['bubble_rate']:.3f}; measured {measured['samples_per_s']:.2f} at "
                        f"{measured['bubble_rate']:.3f} (twice)")


def test_the_fitted_profile_predicts_another_config(calibration, tmp_path):
    """Out of sample: the module's profile predicts a config it was not fitted on. The profile
    holds the host's speed at its calibration run, the module's first; once in CI the host ran
    that run 2.4x slower than the run compared with it, seconds later (predicted 2.70 samples/s,
    measured 6.36). A model error repeats and such a hiccup rarely does, so a miss is measured
    once more, with a profile fitted on a calibration run made right before the run it predicts."""
    skip_if_overloaded()
    other = ("dataset=swe_smith", "minibatch_size=3", "seed=7")
    for attempt in range(2):
        if attempt:
            calibration = fitted(tmp_path, *real_run(tmp_path / "calibration", "dataset=longalign")[::2])
        spec, _, events = real_run(tmp_path / f"real{attempt}", *other)
        measured = timing(spec, events)
        _, predicted, _ = sim_run(tmp_path / f"sim{attempt}", calibration, *other)
        if predicted["samples_per_s"] == pytest.approx(measured["samples_per_s"], rel=0.35):
            break
    assert predicted["samples_per_s"] == pytest.approx(measured["samples_per_s"], rel=0.35)


def self_calibrated_ratios(tmp, *config) -> tuple[float, float]:
    """(predicted, measured) odc/collective throughput, each engine simulated with a profile
    fitted on its own run."""
    measured, predicted = {}, {}
    for engine in ("collective", "odc"):
        spec, _, events = real_run(tmp / engine, *config, f"engine={engine}")
        path = tmp / f"cal-{engine}.json"
        path.write_text(json.dumps(fit({engine: [(spec, events)]})))
        measured[engine] = timing(spec, events)["samples_per_s"]
        predicted[engine] = sim_run(tmp / f"sim-{engine}", path, *config, f"engine={engine}")[1]["samples_per_s"]
    return predicted["odc"] / predicted["collective"], measured["odc"] / measured["collective"]


def test_the_odc_over_collective_ratio_of_a_small_config(tmp_path):
    """The predicted ratio carries the model's error only: each engine's profile is fitted on
    its own run. (A profile pooled over both runs shares one compute fit, so the host's speed
    drifting between the two runs, made one after the other, moved the measured ratio away
    from the prediction by itself: 14% in one CI run. The validation, odc_bench.studies.validation,
    measures that part with interleaved, repeated runs.) Even so, a hiccup of this shared host
    inside one of the two 5-second runs missed by 8% once, where four pairs in a row here missed
    by 0.1-2.0%; a model error repeats and a hiccup rarely does, so a miss is measured once
    more, on fresh runs, before it fails."""
    skip_if_overloaded()
    config = ("dataset=longalign", "seed=3")
    for attempt in range(2):
        predicted, measured = self_calibrated_ratios(tmp_path / f"attempt{attempt}", *config)
        if predicted == pytest.approx(measured, rel=0.10):
            break
    assert predicted == pytest.approx(measured, rel=0.10)
