"""Shared fixtures: a roofline ground truth (a deterministic real function) and training sets computed from it."""
import pytest

from oracle.core import ModelProfile
from oracle.profile.grid import LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set
from oracle.roofline import RooflineModel
from oracle.specs import h200, model_shape

TTFT_SLO_MS, TPOT_SLO_MS = 300.0, 20.0
MIXES = [LengthMix("chat", 400, 0.8, 150), LengthMix("rag", 2000, 0.5, 100), LengthMix("short", 100, 0.3, 300)]


@pytest.fixture(scope="session")
def roofline():
    return RooflineModel(h200(), model_shape("qwen2-7b"))


@pytest.fixture(scope="session")
def profile(roofline):
    return ModelProfile(roofline, TTFT_SLO_MS, TPOT_SLO_MS)


@pytest.fixture(scope="session")
def training_set(roofline):
    grid = load_grid([2, 5, 10, 20, 40, 80], MIXES, [1, 2, 4])
    return roofline_training_set("qwen", roofline, grid, TTFT_SLO_MS, TPOT_SLO_MS, need_noise_rel=0.05,
                                 attainment_noise=0.02, seed=1)
