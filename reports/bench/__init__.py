"""Benchmarks behind ``verigrad bench``: one module per suite (``ops``, ``train``), each with
``add_arguments(parser)`` and ``run(args) -> int``."""
SUITES = ("ops", "train")
