"""JAX as an engine: every registry op through ``jax.numpy`` and ``jax.vjp`` (CPU).

The long story: docs/reports-peers.md, section ``reports/conformance/adapters/jax.py``.
"""
from __future__ import annotations

import numpy as np

import optable

from reports.conformance.engines import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, Engine

__all__ = ["JaxEngine", "jax_ops"]


def jax_ops(jax, jnp):
    """The op table: registry name -> function of jax arrays taking the params as keywords."""

    def dims(axis, ndim):
        axes = tuple(range(ndim)) if axis is None else axis
        return (axes,) if isinstance(axes, int) else tuple(axes)

    def reduce(fn, x, axis, keepdims):
        axes = dims(axis, x.ndim)
        return x + 0 if not axes else fn(x, axis=axes, keepdims=keepdims)

    def slice_(x, axis=0, start=0, stop=None, step=1):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop, step)
        return x[tuple(index)]

    def layer_norm(x, eps=1e-5):
        centred = x - jnp.mean(x, axis=-1, keepdims=True)
        return centred / jnp.sqrt(jnp.mean(centred**2, axis=-1, keepdims=True) + eps)

    def rms_norm(x, eps=1e-6):
        return x / jnp.sqrt(jnp.mean(x**2, axis=-1, keepdims=True) + eps)

    def cross_entropy(z, t):
        logp = jax.nn.log_softmax(z, axis=-1)
        picked = jnp.take_along_axis(logp, t.reshape(-1, 1), axis=1)
        return -jnp.mean(picked)

    def categorical(z, t):
        return -jnp.sum(t * jax.nn.log_softmax(z, axis=-1)) / z.shape[0]

    def bce(p, t):
        return -jnp.mean(t * jnp.log(p) + (1 - t) * jnp.log1p(-p))

    def bce_logits(z, t):
        return jnp.mean(jax.nn.softplus(z) - z * t)

    return {
        "neg": lambda x: -x, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt,
        "square": jnp.square, "abs": lambda x: x * jnp.sign(x), "relu": jax.nn.relu,
        "leaky_relu": lambda x, negative_slope=0.01: jnp.where(x > 0, x, negative_slope * x),
        "silu": jax.nn.silu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
        "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
        "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "softplus": jax.nn.softplus,
        "identity": lambda x: x + 0,
        "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide,
        "maximum": lambda a, b: jnp.where(a >= b, a, b),
        "sum": lambda x, axis=None, keepdims=False: reduce(jnp.sum, x, axis, keepdims),
        "mean": lambda x, axis=None, keepdims=False: reduce(jnp.mean, x, axis, keepdims),
        "logsumexp": lambda x, axis=None, keepdims=False: reduce(
            jax.scipy.special.logsumexp, x, axis, keepdims),
        "matmul": jnp.matmul,
        "transpose": lambda x, axes=None: jnp.transpose(x, axes),
        "reshape": lambda x, shape: jnp.reshape(x, shape),
        "concat": lambda a, b, axis=-1: jnp.concatenate([a, b], axis=axis),
        "slice": slice_,
        "softmax": lambda x, axis=-1: jax.nn.softmax(x, axis=axis),
        "log_softmax": lambda x, axis=-1: jax.nn.log_softmax(x, axis=axis),
        "layer_norm": layer_norm, "rms_norm": rms_norm,
        "mse": lambda p, t: jnp.mean((p - t) ** 2),
        "cross_entropy": cross_entropy,
        "categorical_cross_entropy": categorical,
        "binary_cross_entropy": bce,
        "binary_cross_entropy_with_logits": bce_logits,
    }


#: ops whose sums, forward and VJP, JAX runs in float32 for bfloat16 and float16 inputs: their
#: traced programs (``jax.make_jaxpr`` of the value and its VJP) hold no reduce_sum in the
#: storage format (jnp.sum / jnp.mean upcast) and their dot products accumulate in float32
FLOAT32_SUMS = ("sum", "mean", "matmul", "mse", "binary_cross_entropy",
                "binary_cross_entropy_with_logits")
#: ops whose traced VJP sums in the storage format (reduce_sum transposing a broadcast); the
#: binary ops do so whenever an operand is broadcast
STORAGE_SUMS = ("add", "sub", "mul", "div", "maximum", "logsumexp", "softmax", "log_softmax",
                "layer_norm", "rms_norm", "cross_entropy", "categorical_cross_entropy")

# op -> position of its class-index input (the op table's)
CLASS_INDEX = {n: sig.inputs.index(i) for n, sig in optable.OPS.items() for i in sig.class_index}


_OPTAX_REASONS = {
    "Momentum": "optax.sgd(momentum=beta) keeps v = beta*v + g (no (1 - beta) on g)",
    "NAG": "optax.sgd(nesterov=True) is another look-ahead form than the registry's",
}
# optax state field -> registry state name, per optimizer
_OPTAX_STATE = {"SGD": {}, "RMSprop": {"nu": "E"}, "Adagrad": {"sum_of_squares": "G"},
                "Adam": {"mu": "m", "nu": "v"}, "AdamW": {"mu": "m", "nu": "v"}}


def _optax_transform(optax, name, hyper):
    lr = hyper.get("lr", 0.01 if name in ("SGD", "Adagrad") else 0.001)
    if name == "SGD":
        return optax.sgd(lr)
    if name == "RMSprop":
        return optax.rmsprop(lr, decay=hyper.get("gamma", 0.9), eps=hyper.get("eps", 1e-8),
                             initial_scale=0.0, eps_in_sqrt=True)
    if name == "Adagrad":
        return optax.adagrad(lr, initial_accumulator_value=0.0, eps=hyper.get("eps", 1e-8))
    kwargs = dict(b1=hyper.get("beta1", 0.9), b2=hyper.get("beta2", 0.999),
                  eps=hyper.get("eps", 1e-8))
    if name == "AdamW":
        return optax.adamw(lr, weight_decay=hyper.get("weight_decay", 0.01), **kwargs)
    return optax.adam(lr, **kwargs)


def _map_state(state, fn):
    """Rebuild optax's (nested named-tuple) state with ``fn(field, value)`` on every field."""
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return state._replace(**{f: fn(f, getattr(state, f)) if not isinstance(
            getattr(state, f), tuple) else _map_state(getattr(state, f), fn)
            for f in state._fields})
    if isinstance(state, tuple):
        return tuple(_map_state(x, fn) for x in state)
    return state


CACHE_ENV = "VERIGRAD_JAX_CACHE"
CACHE_MAX_BYTES = 512 * 2**20


def compilation_cache_dir():
    """Where compiled JAX executables are kept between runs, or None (``VERIGRAD_JAX_CACHE``).

    ``VERIGRAD_JAX_CACHE=DIR`` chooses the folder and ``VERIGRAD_JAX_CACHE=off`` turns the
    cache off; the default is ``verigrad/jax`` under ``$XDG_CACHE_HOME`` (``~/.cache``).
    """
    import os
    import pathlib

    chosen = os.environ.get(CACHE_ENV, "").strip()
    if chosen.lower() in ("off", "0", "none", "no"):
        return None
    if chosen:
        return pathlib.Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "verigrad" / "jax"


def _use_compilation_cache(jax):
    """Keep compiled executables on disk, unless the program has chosen a cache of its own.

    NOTE: every (op, params, shape, dtype) is its own XLA executable, about a tenth of a
    second of compiling each: the quick report compiles nearly 400 of them, as long as all of
    its exact arithmetic. JAX's persistent cache is keyed by the program, the JAX and XLA
    versions and the flags, so a cached executable is exactly what compiling would give.
    """
    if jax.config.jax_compilation_cache_dir:      # the program chose its own cache
        return
    folder = compilation_cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:       # a read-only home: compile every time, as without a cache
        return
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)


class JaxEngine(Engine):
    """JAX (CPU, x64 enabled) as an engine: ``jax.vjp`` of ``jax.numpy`` functions."""

    name = "jax"
    dtypes = (FLOAT32, FLOAT64, BFLOAT16, FLOAT16)
    description = "JAX (CPU, x64 enabled) through jax.vjp"
    # NOTE: what JAX accumulates bfloat16 and float16 in, op by op, read from the programs it
    # traces (``STORAGE_SUMS``): jnp.sum and jnp.mean compute in float32 and cast back
    # (upcast_f16_for_computation, jax/_src/numpy/reductions.py), and XLA's CPU dot
    # accumulates in float32; but the VJPs of broadcasting ops and of softmax, log-sum-exp, the
    # norms and the cross-entropies transpose a broadcast into lax.reduce_sum, which sums in
    # the storage format itself (JAX's documentation: reduce_sum does not upcast)
    accumulates = {fmt: {op: "float32" for op in FLOAT32_SUMS}
                   for fmt in ("bfloat16", "float16")}
    CLEAR_EVERY = 256    # calls between dropping compiled executables

    def __init__(self):
        import jax

        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_platforms", "cpu")
        _use_compilation_cache(jax)
        import jax.numpy as jnp

        self._jax, self._jnp = jax, jnp
        self._ops = jax_ops(jax, jnp)
        # an op of the table that this adapter does not map yet is declared, not a KeyError
        self.unsupported = {**self.unsupported, **{
            n: "the jax adapter has no mapping for it yet (jax_ops)" for n in optable.OPS
            if n not in self._ops}}
        self._cache = {}
        self._calls = 0

    def supports_optimizer(self, name):
        """optax's optimizers that follow the registry (when optax is installed)."""
        import importlib.util

        if importlib.util.find_spec("optax") is None:
            return False, "optax is not installed (pip install optax)"
        if name in _OPTAX_STATE:
            return True, ""
        return False, _OPTAX_REASONS.get(name, f"optax has no {name} in the registry's form")

    def _optimizer_step(self, name, w, g, state, t, **hyper):
        import optax

        jnp = self._jnp
        w = np.asarray(w)
        tx = _optax_transform(optax, name, hyper)
        names = _OPTAX_STATE[name]
        state = state or {}

        def restore(field, value):
            if field == "count":
                return jnp.asarray(t - 1, dtype=value.dtype)
            if field in names:
                return jnp.asarray(np.asarray(state.get(names[field], np.zeros_like(w)),
                                              dtype=w.dtype))
            return value

        opt_state = _map_state(tx.init(jnp.asarray(w)), restore)
        updates, opt_state = tx.update(jnp.asarray(np.asarray(g, dtype=w.dtype)), opt_state,
                                       jnp.asarray(w))
        new_w = np.array(optax.apply_updates(jnp.asarray(w), updates))
        found = {}
        _map_state(opt_state, lambda f, v: found.setdefault(names[f], np.array(v))
                   if f in names else v)
        return new_w, found

    def _jitted(self, kind, name, params, fixed):
        """The jitted functions of op ``name`` with ``params`` closed over: ``kind`` ``"vjp"``
        gives (forward, pull-back), ``"jvp"`` the JVP, ``"hvp"`` the HVP; one executable per
        op, parameters and shapes."""
        key = (kind, name, repr(sorted(params.items())))
        self._calls += 1
        if self._calls % self.CLEAR_EVERY == 0:
            # NOTE: every (op, params, shape) compiles an executable; drop them now and then, or
            # a long run holds gigabytes of them.
            self._jax.clear_caches()
            self._cache.clear()
        if key not in self._cache:
            self._cache[key] = self._build(kind, self._ops[name], params, fixed)
        return self._cache[key]

    def _build(self, kind, fn, params, fixed):
        jax = self._jax

        def call(args, target):
            args = list(args)
            if fixed is not None:
                args.insert(fixed, target)
            return fn(*args, **params)

        if kind == "vjp":
            def pull(args, target, g):
                return jax.vjp(lambda *a: call(a, target), *args)[1](g)
            return jax.jit(call), jax.jit(pull)
        if kind == "jvp":
            def product(free, target, tans):
                return jax.jvp(lambda *a: call(a, target), free, tans)
        else:
            # jvp of the VJP (forward over reverse): d/dε [J(x + εt)ᵀ g], no Hessian formed
            def product(free, target, tans, g):
                def pulled(*args):
                    return jax.vjp(lambda *a: call(a, target), *args)[1](g)
                return jax.jvp(pulled, free, tans)[1]
        return jax.jit(product)

    def _arguments(self, name, inputs):
        fixed = CLASS_INDEX.get(name)
        arrays = [np.asarray(x) for x in inputs]
        target = None if fixed is None else self._jnp.asarray(arrays[fixed].astype(np.int64))
        free = tuple(self._jnp.asarray(a) for i, a in enumerate(arrays) if i != fixed)
        return free, target, fixed

    def _forward(self, name, inputs, **params):
        free, target, fixed = self._arguments(name, inputs)
        forward, _ = self._jitted("vjp", name, params, fixed)
        return np.array(forward(free, target))

    def _second_order_args(self, name, inputs, tangents):
        free, target, fixed = self._arguments(name, inputs)
        tans = tuple(self._jnp.asarray(np.asarray(t, dtype=a.dtype)) for i, (t, a) in
                     enumerate(zip([t for i, t in enumerate(tangents) if i != fixed], free)))
        return free, target, fixed, tans

    def _jvp(self, name, inputs, tangents, **params):
        free, target, fixed, tans = self._second_order_args(name, inputs, tangents)
        out, jv = self._jitted("jvp", name, params, fixed)(free, target, tans)
        return np.array(out), np.array(jv)

    def _hvp(self, name, inputs, cotangent, tangents, **params):
        free, target, fixed, tans = self._second_order_args(name, inputs, tangents)
        g = self._jnp.asarray(np.asarray(cotangent, dtype=free[0].dtype))
        hv = self._jitted("hvp", name, params, fixed)(free, target, tans, g)
        out = [np.array(h) for h in hv]
        if fixed is not None:
            out.insert(fixed, None)
        return tuple(out)

    def _vjp(self, name, inputs, grad, **params):
        free, target, fixed = self._arguments(name, inputs)
        forward, pull = self._jitted("vjp", name, params, fixed)
        dtype = free[0].dtype
        grads = [np.array(g) for g in pull(free, target, self._jnp.asarray(
            np.asarray(grad, dtype=dtype)))]
        if fixed is not None:
            grads.insert(fixed, None)
        return tuple(grads)
