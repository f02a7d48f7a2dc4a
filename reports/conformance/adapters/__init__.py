"""Adapters that let other autograd engines answer the registry's questions (PyTorch, JAX).

Each is an optional extra (``pip install 'verigrad[torch]'`` / ``'verigrad[jax]'``) and is
imported only when its engine is asked for, so the suite runs without them.
"""
