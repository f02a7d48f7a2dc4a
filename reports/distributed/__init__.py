"""Running verigrad's work beyond one process.

- ``cluster``: the conformance suite, the mutant run and the accuracy report on a Dask cluster
  (``--cluster local:N`` or ``--cluster tcp://host:8786``), row for row what a serial run gives;
- ``bench``: ``verigrad bench train --distributed``, data-parallel training under ``mpiexec``
  at 1, 2, ... ranks (``bench_worker`` is the program each rank runs).

Data-parallel training itself lives in ``fastlib.training.distributed``.
"""
