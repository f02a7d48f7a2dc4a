"""The conformance suite behind ``verigrad conform``: importable, so it runs from an installed
package as well as from a checkout (``tests/conformance`` holds the pytest entry points).

The long story: docs/reports-conformance.md, section ``reports/conformance/__init__.py``.
"""
