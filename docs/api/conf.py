"""Sphinx configuration of the API reference (built by tests/test_docs_site.py with -W)."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

project = "verigrad"
author = "the verigrad authors"
copyright = "the verigrad authors, MIT licence"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]

# numpydoc docstrings, read by napoleon (part of Sphinx: no other package needed)
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_param = True
napoleon_use_ivar = True
napoleon_preprocess_types = False

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "none"          # signatures carry the types; the docstrings say what they mean
# optional peers and GPU packages are not needed to document the API
autodoc_mock_imports = ["torch", "jax", "jaxlib", "optax", "mpi4py", "dask", "distributed",
                        "paddle", "tinygrad", "mygrad", "autograd"]
suppress_warnings = ["ref.python"]   # the same name exported by a package and its module
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []
