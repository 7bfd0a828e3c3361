"""GP training with gpytorch (the only part of the oracle that imports torch). Prediction runs on the numpy
posterior it produces (oracle/core/posterior.py)."""
from .train import fit_capacity, fit_elasticity, fit_exact_gp


def gp_oracle(profiles=None, policy=None):
    """An Oracle whose refits train gpytorch GPs (the core itself never imports torch)."""
    from oracle.core.oracle import Oracle
    from oracle.core.policy import OraclePolicy

    return Oracle(profiles or {}, policy=policy or OraclePolicy(), capacity_trainer=fit_capacity,
                  elasticity_trainer=fit_elasticity)


__all__ = ["fit_capacity", "fit_elasticity", "fit_exact_gp", "gp_oracle"]
