"""Model lifecycle and the data plane on a worker: restore from host, fork from a live replica, verify before
ready, P/D KV transfer, lifecycle command handling. The transition table itself is worker/core/lifecycle.py.
See docs/lifecycle.md."""
