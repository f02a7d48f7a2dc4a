"""Where a recorded figure came from: the machine, the versions, the date, the load.

Every results file (``reports.results_tables``) and the peers' findings file
(``reports.peers_findings``) records these beside its command, so that a table rendered from
it can say how and where it was measured.
"""
from __future__ import annotations

import datetime
import os
import platform

__all__ = ["machine", "versions", "now", "load_average", "MEASURED_PACKAGES"]

#: the distributions whose versions a results file records (those installed)
MEASURED_PACKAGES = ("verigrad", "numpy", "numba", "scipy", "sympy", "mpmath", "ml_dtypes", "torch",
                     "jax", "jaxlib")


def machine() -> dict:
    """``{"system", "processor", "cpus", "python"}`` of this machine."""
    return {"system": f"{platform.system()} {platform.machine()}",
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version()}


def versions(names=MEASURED_PACKAGES, dists=None) -> dict:
    """``{name: version}`` of the installed distributions among ``names`` (``dists`` maps a
    name to its distribution where they differ, e.g. ``paddle`` -> ``paddlepaddle``)."""
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version((dists or {}).get(name, name))
        except metadata.PackageNotFoundError:
            pass
    return out


def now() -> str:
    """The date and time in UTC, to the minute (``2026-11-27 14:05 UTC``)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def load_average():
    """The one-minute load average, or None where the platform has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None
