"""The oracle: what a model needs (Capacity GP) and what m replicas of it achieve (Elasticity GP), with the analytic
roofline model (oracle.roofline, oracle.specs) behind the same interface where no profile exists.

Importing `oracle` and its pure modules never imports torch; only oracle.gp does (see docs/oracle.md).
"""
