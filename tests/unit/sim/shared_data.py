"""The simulator's workloads come from the shared traces (`sim.paths`): tests that need them skip, saying why,
on a checkout that has no `shared/` folder beside it and no JANUS_SHARED_DIR."""
import pytest

from sim.paths import traces_dir

needs_traces = pytest.mark.skipif(not (traces_dir() / "servegen_m_large").is_dir(),
                                  reason=f"shared traces not found at {traces_dir()} (set JANUS_SHARED_DIR)")
