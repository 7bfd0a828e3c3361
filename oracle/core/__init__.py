"""The oracle's pure core: features, GP posteriors in numpy, monotone correction, training sets, the Oracle."""
from .dataset import CapacitySample, ElasticitySample, TrainingSet
from .oracle import ModelProfile, Oracle, UnknownModelError, calibrated_profile, roofline_meta
from .policy import OraclePolicy

__all__ = ["CapacitySample", "ElasticitySample", "ModelProfile", "Oracle", "OraclePolicy", "TrainingSet",
           "UnknownModelError", "calibrated_profile", "roofline_meta"]
