from pathlib import Path

import numpy as np
import pytest
import yaml

import odc_bench
from odc_bench.data.profiles import PROFILES, pareto_mean, profile_lengths, profile_max_len
from odc_bench.data.tokens import sample_tokens
from tests.helpers import run_config

# Published means (shared PAPER.md): LongAlign ~16.5K, SWE-smith ~34.7K, AIME RL ~9K.
PUBLISHED_MEAN = {"longalign": 16_500, "swe_smith": 34_700, "aime": 9_000}
PUBLISHED_MAX = {"longalign": 65_536, "swe_smith": 131_072, "aime": 16_384}


@pytest.mark.parametrize("name", sorted(PUBLISHED_MEAN))
def test_profile_matches_published_mean_and_range(name):
    lengths = profile_lengths(name, 1.0, seed=0)
    assert abs(lengths.mean() / PUBLISHED_MEAN[name] - 1) < 0.03
    assert lengths.max() <= PUBLISHED_MAX[name]
    assert lengths.std() / lengths.mean() > 0.3, "the point of the profiles is their spread"


def test_pareto_profile_has_its_stated_tail():
    lengths = profile_lengths("pareto", 1.0, seed=0)
    prof = PROFILES["pareto"]
    assert prof.min_len <= lengths.min() and lengths.max() <= prof.max_len
    assert abs(lengths.mean() / pareto_mean(2_048, 131_072, 1.2) - 1) < 0.03
    # P(length > x) = ((a/x)^alpha - (a/b)^alpha) / (1 - (a/b)^alpha): the fraction above 8K.
    a, b, alpha = 2_048, 131_072, 1.2
    above = ((a / 8_192) ** alpha - (a / b) ** alpha) / (1 - (a / b) ** alpha)
    assert (lengths > 8_192).mean() == pytest.approx(above, abs=0.01)


def test_fixed_profile_is_the_balanced_control():
    lengths = profile_lengths("fixed", 1 / 64, seed=0)
    assert set(lengths.tolist()) == {1024}


def test_length_scale_keeps_the_shape():
    full = profile_lengths("longalign", 1.0, seed=0)
    small = profile_lengths("longalign", 1 / 64, seed=0)
    np.testing.assert_allclose(small, np.maximum(2, np.rint(full / 64)), atol=1)
    assert profile_max_len("longalign", 1 / 64) == 1024


def test_profiles_are_seeded():
    assert np.array_equal(profile_lengths("aime", 0.1, 5), profile_lengths("aime", 0.1, 5))
    assert not np.array_equal(profile_lengths("aime", 0.1, 5), profile_lengths("aime", 0.1, 6))


def test_tokens_depend_only_on_seed_sample_and_length():
    a = sample_tokens(1, 42, 100, 1000)
    assert a.tolist() == sample_tokens(1, 42, 100, 1000).tolist()
    assert a.tolist() != sample_tokens(1, 43, 100, 1000).tolist()
    assert int(a.min()) >= 0 and int(a.max()) < 1000


DATASET_FILES = Path(odc_bench.__file__).parent / "conf" / "dataset"
PROFILE_DATASETS = sorted(p.stem for p in DATASET_FILES.glob("*.yaml") if "profile" in yaml.safe_load(p.read_text()))


def test_the_profile_datasets_are_the_profiles():
    assert set(PROFILE_DATASETS) <= set(PROFILES) and {"longalign", "pareto"} <= set(PROFILE_DATASETS)


@pytest.mark.parametrize("name", PROFILE_DATASETS)
def test_every_profile_dataset_defaults_to_this_cpus_scale(name):
    """Each dataset file sets its own length_scale: a profile that forgot it would train on its
    full lengths (128K-token samples on a CPU rank) where every other profile is at 1/64."""
    assert run_config(f"dataset={name}").dataset.length_scale == pytest.approx(1 / 64)
