"""Profiling: synthetic open-loop load over a grid, driven through the real engine (harness) or through the
roofline model (synthetic sets for tests and the simulator); both write the TrainingSet JSON format."""
