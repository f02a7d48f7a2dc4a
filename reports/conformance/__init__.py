"""The conformance suite behind ``verigrad conform``: importable, so it runs from an installed
package as well as from a checkout (``tests/conformance`` holds the pytest entry points).

Modules, one idea each:

- ``engines``: the engine registry and protocol (``get_engine``, ``available_engines``), shared
  with ``verigrad report``; ``adapters/``: PyTorch and JAX as engines;
- ``strategies``: Hypothesis strategies (op cases with broadcasting, random DAGs, models,
  optimizer runs);
- ``bounds``: the error bound of every op family, in units of the dtype's eps;
- ``oracle``: exact values (``spec.evaluate`` at 50 digits, cached) and the error measure;
- ``special_values``: the table of saturations, extreme logits, tiny/huge magnitudes, zeros,
  ties and long reductions;
- ``properties``: the checks, plain functions of a drawn case (no pytest needed);
- ``runner``: runs the checks under a profile, collects rows, shrinks failures into
  ready-to-paste reproductions;
- ``mutants``: plausible bugs applied to a temporary copy of fastlib, to measure the suite's power.
"""
