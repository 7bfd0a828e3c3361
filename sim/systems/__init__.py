"""The systems the simulator compares: Janus and its baselines and ablations, each a control plane over the same
engine, devices and dispatcher core."""
