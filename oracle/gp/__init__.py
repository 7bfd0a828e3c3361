"""GP training with gpytorch (the only part of the oracle that imports torch). Prediction runs on the numpy
posterior it produces (oracle/core/posterior.py)."""
from .train import fit_capacity, fit_elasticity, fit_exact_gp

__all__ = ["fit_capacity", "fit_elasticity", "fit_exact_gp"]
