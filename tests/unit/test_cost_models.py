import json

import pytest
import torch

from odc_bench.balancers.cost import CostModel, device_tag, flops, linear, load_calibration, quadratic
from odc_bench.errors import ConfigError
from odc_bench.models.flops import train_flops
from odc_bench.plan.spec import resolve
from tests.helpers import run_config


def test_linear_costs_tokens_and_microbatches_sum_their_documents():
    cost = linear()
    assert cost(1234) == 1234
    assert cost.microbatch([100, 200, 3]) == 303


@pytest.mark.parametrize(("fit", "a", "b"), [("1p5b", 1.982122, 2.611821), ("7b", 4.348357, 8.768377)])
def test_quadratic_uses_the_reference_fits_on_len_over_32000(fit, a, b):
    cost = quadratic(fit)
    assert cost(32_000) == pytest.approx(a + b)
    assert cost(64_000) == pytest.approx(4 * a + 2 * b)
    # attention is per document: two halves cost less than the whole
    assert cost.microbatch([32_000, 32_000]) < cost(64_000)


def test_flops_matches_the_model_flops_count_per_document():
    cfg = run_config("model=qwen2_1p5b").model
    cost = flops(cfg)
    for n in (1, 777, 65_536):
        assert cost(n) == pytest.approx(train_flops(cfg, [n]) / 1e12, rel=1e-9)
    assert cost.microbatch([1000, 3000]) == pytest.approx(train_flops(cfg, [1000, 3000]) / 1e12, rel=1e-9)
    assert cost.a > 0, "attention is included"


def test_device_tags_are_file_name_safe():
    assert device_tag("cpu") == "cpu"
    assert device_tag("cuda", "NVIDIA H100 80GB HBM3") == "cuda-nvidia-h100-80gb-hbm3"


def test_calibration_file_round_trips_and_bad_files_are_refused(tmp_path):
    good = tmp_path / "tiny-cpu.json"
    good.write_text(json.dumps(dict(a=0.5, b=0.1, c=0.01, unit=1000)))
    cost = load_calibration(good)
    assert cost == CostModel("calibrated:tiny-cpu", a=0.5, b=0.1, c=0.01, unit=1000)
    assert cost.microbatch([1000, 2000]) == pytest.approx(0.01 + 0.6 + 2.2)
    for text in ("{not json", json.dumps(dict(a=1)), json.dumps(dict(a=-1, b=1, c=0, unit=1000))):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match="bad.json"):
            load_calibration(tmp_path / "bad.json")


@pytest.mark.parametrize(("cost_model", "label"), [("linear", "linear"), ("quadratic", "quadratic:1p5b"),
                                                    ("flops", "flops")])
def test_run_config_selects_the_cost_model(cost_model, label):
    spec = resolve(run_config("balancer=lb_micro", f"balancer.cost_model={cost_model}", "num_minibatches=1",
                                  "warmup_minibatches=0"))
    assert spec.cost_model.label == label


def test_calibrated_cost_model_loads_the_file_or_says_to_run_calibrate(tmp_path):
    missing = tmp_path / "none.json"
    with pytest.raises(ConfigError,
                       match=r"no calibration at .*none.json; run `python -m odc_bench.calibrate.cost_model"):
        resolve(run_config("balancer=lb_micro", "balancer.cost_model=calibrated",
                               f"balancer.calibration={missing}"))
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(dict(a=0.4, b=0.03, c=0.01, unit=1000)))
    spec = resolve(run_config("balancer=lb_micro", "balancer.cost_model=calibrated",
                                  f"balancer.calibration={path}", "num_minibatches=1", "warmup_minibatches=0"))
    assert spec.cost_model.label == "calibrated:cal"


def test_the_default_calibration_is_the_repositorys_from_any_working_folder(tmp_path, monkeypatch):
    """sweep=demo plans with the committed results/calibration/tiny-cpu.json: run from another
    folder, every run was refused ("no calibration at results/calibration/tiny-cpu.json")."""
    monkeypatch.chdir(tmp_path)
    spec = resolve(run_config("balancer=lb_micro", "balancer.cost_model=calibrated", "device=cpu",
                              "num_minibatches=1", "warmup_minibatches=0"))
    assert spec.cost_model.label == "calibrated:tiny-cpu"
    assert not (tmp_path / "results").exists()


def test_cost_is_evaluated_on_the_scaled_lengths_the_run_uses():
    # The default job scales LongAlign by 1/64: the quadratic fit, made for real lengths,
    # must see the lengths the ranks actually train on.
    spec = resolve(run_config("balancer=lb_micro", "num_minibatches=1", "warmup_minibatches=0"))
    mb = spec.minibatches[0]
    cost = quadratic("1p5b")
    assert mb.prediction.work == pytest.approx(sum(cost(n) for n in mb.lengths))
    assert max(mb.lengths) <= spec.max_tokens == 1024


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_calibrated_on_cuda_without_a_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="device=cuda but no CUDA device is visible"):
        resolve(run_config("balancer=lb_micro", "balancer.cost_model=calibrated", "device=cuda"))
