"""Every module of the four packages imports: a name moved away from a module another one
imports from fails here, not only on the machine that runs the one command that reaches it."""
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("optable", "spec", "reflib", "fastlib", "reports")

_SCRIPT = """
import importlib, pkgutil, sys, traceback
failed = []
for pkg in sys.argv[1:]:
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception:
            failed.append(info.name + ": " + traceback.format_exc(limit=1).strip().splitlines()[-1])
print("\\n".join(failed))
"""


def test_every_module_imports():
    # the simulator stands in for a GPU so fastlib.cuda's modules import as they do on one
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *PACKAGES], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = [line for line in proc.stdout.splitlines() if line.strip()]
    assert not failed, "modules that do not import:\n" + "\n".join(failed)
