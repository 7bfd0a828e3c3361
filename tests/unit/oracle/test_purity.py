"""The oracle's pure parts import neither torch (only oracle.gp and the profiler may) nor the bus."""
import subprocess
import sys

PURE = ["oracle", "oracle.core", "oracle.refit", "oracle.specs", "oracle.cpu_device", "oracle.roofline",
        "oracle.attainment", "oracle.profile.grid", "oracle.profile.measure", "oracle.profile.replay", "oracle.profile.synthetic",
        "oracle.profile.calibrate", "oracle.profile.workload"]


def test_pure_modules_do_not_import_torch_or_nats():
    code = ("import sys, importlib\n"
            f"for m in {PURE!r}: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'gpytorch', 'nats', 'runtime'))\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
