"""Hypothesis draws that depend on the seed alone, not on which modules happen to be loaded.

Hypothesis (6.1xx) mixes into its draws, now and then, literal constants it collects from the
source of every *local* module in ``sys.modules`` (local: not the standard library, not
site-packages, not a test file). From a source checkout verigrad's own modules are local, so a
row's examples changed with what the process had imported: importing one more module of the
project changed the Adam row's drawn cases (and its error) in the same run with the same seed,
and a Dask worker, which imports other modules than the command line, could draw other cases
than the serial run. An installed verigrad (site-packages) has no local constants at all.
:func:`seed_only` gives every run that installed behaviour: an empty pool of local constants
(Hypothesis's own global constants still come up), so the draws are a function of the seed and
the strategy.
"""
from __future__ import annotations

import contextlib

__all__ = ["seed_only"]


@contextlib.contextmanager
def seed_only():
    """Run Hypothesis with an empty pool of local constants inside the block.

    NOTE: this reaches into Hypothesis's provider module (no public setting turns the local
    constants off); when that internal is missing (another Hypothesis version), the block runs
    unchanged and ``tests/test_cluster.py`` shows whether draws still depend on imports.
    """
    try:
        from hypothesis.internal.conjecture import providers
        empty = providers.Constants()
        original = providers._get_local_constants
        cache = providers.CONSTANTS_CACHE
    except (ImportError, AttributeError):
        yield
        return
    # the cache holds each type's permitted constants, local ones included: start clean, and
    # leave clean for any run outside the block
    cache.cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.cache.clear()
