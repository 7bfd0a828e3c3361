"""The operator tools: the `janus` command (ops/cli.py), the local launcher (`janus up`), the checked cluster-config
loader and its effective policies, the checkpoint preflight, the demo checkpoints and the engine profiler.

They compose the services (start them, read their policies, drive the worker's engine for the oracle's profile), so
they sit above them; no service imports this package (docs/architecture.md, "Layers")."""
