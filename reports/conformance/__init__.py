"""The conformance suite behind ``verigrad conform``: importable, so it runs from an installed
package as well as from a checkout (``tests/conformance`` holds the pytest entry points).

Modules, one idea each:

- ``engines``: the engine registry and protocol (``get_engine``, ``available_engines``), shared
  with ``verigrad report``; ``adapters/``: PyTorch and JAX as engines;
- ``strategies``: Hypothesis strategies (op calls with broadcasting, random DAGs, models of
  every layer type, optimizer runs);
- ``oracle``: exact values (``spec.evaluate`` at 50 digits, cached) and the error measure;
- ``bounds``: the error bound of every op family, in units of the dtype's eps, and the one
  per-element rule (``entrywise``) the suite and ``verigrad report`` judge by;
- ``kinks``: the kink policy (``strict`` conventions or any Clarke subgradient);
- ``special_values``: saturations, extreme logits, tiny / huge magnitudes, zeros, kinks, ties,
  broadcasting, long reductions, targets at their domain's edge, NaN and ±inf;
- ``properties``: the checks, plain functions of a drawn case (no pytest needed);
  ``targetprop`` and ``cd``: the TargetProp and contrastive-divergence properties (shared with
  tests/test_targetprop.py and tests/test_rbm.py), wired in by ``algorithms``;
- ``runner``: runs the checks under a profile, collects rows, keeps up to three distinct
  failures per row;
  ``repro``: turns a failing case into Python to paste;
- ``mutants`` and ``mutant_runner``: plausible bugs applied to a temporary copy of fastlib, to
  measure the suite's power.
"""
