"""The core is pure policy: importing it pulls in no bus, web framework, torch or runtime (docs/architecture.md,
"Layout and house rules")."""
from __future__ import annotations

import subprocess
import sys


def test_core_imports_nothing_impure():
    code = (
        "import sys, dispatcher.core; "
        "bad = [m for m in ('nats', 'fastapi', 'torch', 'runtime', 'dispatcher.service') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
