"""The engine registry: every engine the suite (and ``verigrad report``) can hold to the spec.

An engine answers two questions for registry ops (docs/CONTRACTS.md's table), listed in
docs/reports-conformance.md, section ``reports/conformance/engines.py``, with the long story.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np

import optable

__all__ = [
    "Engine", "EngineProtocol", "EngineStatus", "ENGINES", "UnsupportedOpError",
    "EngineUnavailableError", "UnknownEngineError", "get_engine", "available_engines",
    "engine_status", "check_engine", "registry_ops", "DEFAULT_ENGINES", "supports_in", "claim",
]

FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)
FLOAT16 = np.dtype(np.float16)
#: bfloat16 through ``ml_dtypes`` (the NumPy extension JAX and others use)
BFLOAT16 = optable.formats.dtype_of("bfloat16")
#: every dtype an engine may list: the formats of ``optable.formats``
FORMATS = tuple(optable.formats.dtype_of(n) for n in optable.formats.names())


class UnsupportedOpError(NotImplementedError):
    """An engine was asked for an op (or optimizer) it declares unsupported; says why."""


class EngineUnavailableError(RuntimeError):
    """The engine cannot run here (a missing package, no GPU); the message says why and how."""


class UnknownEngineError(KeyError):
    """An engine name that is neither registered nor ``module:attribute``; lists close names."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0])


@runtime_checkable
class EngineProtocol(Protocol):
    """What the suite needs from an engine (structural: no base class required)."""

    name: str
    dtypes: tuple

    def supports(self, op: str) -> tuple[bool, str]: ...

    def forward(self, name: str, inputs, **params) -> np.ndarray: ...

    def vjp(self, name: str, inputs, grad, **params) -> tuple: ...


def supports_in(engine, op, dtype):
    """``(True, "")`` when ``engine`` runs ``op`` in ``dtype``, else ``(False, reason)``: its
    ``supports`` and, where it has one, its optional ``supports_in(op, dtype)`` (an engine
    whose kernels exist for some formats only, as Paddle's CPU kernels in bfloat16)."""
    ok, reason = claim(engine, "supports", op)
    per_format = getattr(engine, "supports_in", None)
    if ok and callable(per_format):
        return claim(engine, "supports_in", op, np.dtype(dtype))
    return ok, reason


def claim(engine, method, *args):
    """``engine.<method>(*args)`` as the protocol's ``(bool, str)``; a claim that raises or
    has another shape is a broken plugin, refused naming the engine, the call and the fix (the
    plan needs every claim before any row runs, so it cannot become a failing row)."""
    call = f"{getattr(engine, 'name', type(engine).__name__)!s}: {method}" \
           f"({', '.join(repr(str(a)) for a in args)})"
    try:
        got = getattr(engine, method)(*args)
    except Exception as exc:  # noqa: BLE001 - the plugin's own error, named
        raise UnknownEngineError(f"engine {call} raised {type(exc).__name__}: {exc}; it must "
                                 "return (True, '') or (False, 'why not')") from None
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], (bool, np.bool_))):
        raise UnknownEngineError(f"engine {call} returned {got!r}; it must return (True, '') "
                                 "or (False, 'why not')")
    return bool(got[0]), got[1]


def registry_ops():
    """The registry's op names, in registry order (imports ``spec`` on first use)."""
    import spec

    return tuple(spec.OPS)


class Engine:
    """A convenient base for engines: unsupported-op bookkeeping and the optimizer defaults.

    Subclasses set ``name`` and ``dtypes`` and implement ``_forward`` / ``_vjp``; they list the
    ops they cannot do in ``unsupported`` (``{op: reason}``) and the optimizers they run in
    ``optimizers`` (names as in ``spec.OPTIMIZERS``), or override ``supports_optimizer``.
    """

    name: str = "engine"
    dtypes: tuple = (FLOAT64,)
    description: str = ""
    unsupported: dict = {}
    optimizers: tuple = ()
    optimizer_reasons: dict = {}
    no_gradient: dict = {}       # {op: {input: reason}}: inputs without a gradient here
    rounded_once: dict = {}      # {op: {"forward"|"vjp": dtype names}}: results rounded once
    #: {"jvp2"|"hvp": {op: reason}}: a higher derivative the engine cannot take of an op it
    #: supports (its second-order rows read "unsupported" with the reason, not a failure)
    unsupported_derivatives: dict = {}
    # the 16-bit storage formats (docs/engines.md, "16-bit formats"): {storage: format}, or
    # {storage: {op: format, "*": format}}; computes_in: every op evaluated in that format and
    # rounded once to storage; accumulates: every sum in that format
    computes_in: dict = {}
    accumulates: dict = {}

    # -- coverage -----------------------------------------------------------------------------
    def supports(self, op):
        """``(True, "")`` when ``op`` runs here, else ``(False, reason)``."""
        if op in self.unsupported:
            return False, self.unsupported[op]
        if op not in registry_ops():
            return False, f"{op!r} is not a registry op"
        return True, ""

    def supports_in(self, op, dtype):
        """``(True, "")`` when ``op`` runs in ``dtype`` (every listed dtype of a supported op,
        unless a subclass says otherwise), else ``(False, reason)``."""
        return self.supports(op)

    def supports_optimizer(self, name):
        """``(True, "")`` when ``optimizer_step`` runs optimizer ``name``, else the reason."""
        if name in self.optimizers:
            return True, ""
        return False, self.optimizer_reasons.get(
            name, f"the {self.name} engine does not run optimizers")

    def _require(self, op):
        ok, reason = self.supports(op)
        if not ok:
            raise UnsupportedOpError(f"{self.name}: {op} is not supported: {reason}")

    # -- the protocol -------------------------------------------------------------------------
    def forward(self, name, inputs, **params):
        """Forward value of registry op ``name`` (see the module docstring)."""
        self._require(name)
        return self._forward(name, inputs, **params)

    def vjp(self, name, inputs, grad, **params):
        """One cotangent per input of registry op ``name`` (None where not differentiable)."""
        self._require(name)
        return tuple(self._vjp(name, inputs, grad, **params))

    # -- optional: the value its VJP computes on the way -----------------------------------
    @property
    def fused_value(self):
        """True when the engine implements ``_value_and_vjp``: the forward value that its VJP
        computes on the way (a loss and its gradient in one pass), which training uses and
        the suite then holds to the forward's bound (optional)."""
        return callable(getattr(self, "_value_and_vjp", None))

    def value_and_vjp(self, name, inputs, grad, **params):
        """``(forward value, cotangents)`` in one call (optional; see :attr:`fused_value`)."""
        self._require(name)
        if not self.fused_value:
            raise UnsupportedOpError(f"{self.name}: no value_and_vjp provided")
        value, grads = self._value_and_vjp(name, inputs, grad, **params)
        return value, tuple(grads)

    # -- optional: forward mode and second order ----------------------------------------------
    def supports_derivative(self, op, derivative):
        """``(True, "")`` when the engine's ``derivative`` (``"jvp2"``: J t, ``"hvp"``: H t)
        of ``op`` can be checked, else ``(False, reason)``: no second order at all, the op
        unsupported, or that derivative declared missing (``unsupported_derivatives``)."""
        if not self.second_order:
            return False, "not provided: no jvp/hvp"
        ok, reason = self.supports(op)
        if not ok:
            return False, reason
        reason = self.unsupported_derivatives.get(derivative, {}).get(op)
        return (False, reason) if reason else (True, "")

    @property
    def second_order(self):
        """True when the engine implements ``jvp`` and ``hvp`` (both optional)."""
        return hasattr(self, "_jvp") and hasattr(self, "_hvp")

    def jvp(self, name, inputs, tangents, **params):
        """``(forward value, J t)`` of op ``name`` (optional; ``UnsupportedOpError`` if absent)."""
        self._require(name)
        if not self.second_order:
            raise UnsupportedOpError(f"{self.name}: no forward mode (jvp) provided")
        return self._jvp(name, inputs, tangents, **params)

    def hvp(self, name, inputs, cotangent, tangents, **params):
        """``∇_x <g, J(x) t>`` per input (optional; ``UnsupportedOpError`` if absent)."""
        self._require(name)
        if not self.second_order:
            raise UnsupportedOpError(f"{self.name}: no second order (hvp) provided")
        return tuple(self._hvp(name, inputs, cotangent, tangents, **params))

    def optimizer_step(self, name, w, g, state, t, **hyper):
        """One optimizer update (engine form); ``UnsupportedOpError`` unless supported."""
        ok, reason = self.supports_optimizer(name)
        if not ok:
            raise UnsupportedOpError(f"{self.name}: optimizer {name} is not supported: {reason}")
        return self._optimizer_step(name, w, g, state, t, **hyper)

    def _forward(self, name, inputs, **params):  # pragma: no cover - subclasses implement
        raise NotImplementedError

    def _vjp(self, name, inputs, grad, **params):  # pragma: no cover - subclasses implement
        raise NotImplementedError

    def _optimizer_step(self, name, w, g, state, t, **hyper):  # pragma: no cover
        raise NotImplementedError

    def __repr__(self):
        return f"<engine {self.name} ({', '.join(str(np.dtype(d)) for d in self.dtypes)})>"


# ---------------------------------------------------------------------------------------------
# the built-in engines

_OPTIMIZER_NAMES = tuple(optable.OPTIMIZERS)


def _rounded(values):
    """An exact (mpf) array rounded once to float64."""
    return np.asarray(np.asarray(values, dtype=object).astype(float), dtype=np.float64)


class ReflibEngine(Engine):
    """reflib's reference ops in float64 (``reflib.forward`` / ``reflib.vjp``; forward mode and
    second order by ``reflib.jvp`` / ``reflib.hvp`` at 30 digits, rounded to float64)."""

    name = "reflib"
    dtypes = (FLOAT64,)
    description = "the reference engine (NumPy float64; exact with dps=)"
    optimizers = _OPTIMIZER_NAMES

    def _forward(self, name, inputs, **params):
        import reflib

        return reflib.forward(name, inputs, **params)

    def _vjp(self, name, inputs, grad, **params):
        import reflib

        return reflib.vjp(name, inputs, grad, **params)

    # NOTE: forward mode and second order are reflib's exact routes (dual numbers and the
    # recorded second backward at mpmath precision, EXACT_DPS digits), rounded once to float64:
    # the referee's own float64 arithmetic loses the second order at saturated logits and
    # huge norms, where the rows hold every engine to a few roundings.
    EXACT_DPS = 30

    def _jvp(self, name, inputs, tangents, **params):
        import reflib

        value, jt = reflib.jvp(name, inputs, tangents, dps=self.EXACT_DPS, **params)
        return _rounded(value), _rounded(jt)

    def _hvp(self, name, inputs, cotangent, tangents, **params):
        import reflib

        return tuple(None if h is None else _rounded(h) for h in
                     reflib.hvp(name, inputs, cotangent, tangents, dps=self.EXACT_DPS, **params))

    def _optimizer_step(self, name, w, g, state, t, **hyper):
        from reflib import optim

        slots = {k: {"w": np.asarray(v, np.float64)} for k, v in (state or {}).items()}
        new, new_state = optim.step(name, {"w": np.asarray(w, np.float64)},
                                    {"w": np.asarray(g, np.float64)},
                                    {"t": t - 1, "slots": slots}, t=t, **hyper)
        return new["w"], {k: d["w"] for k, d in new_state["slots"].items()}


class FastlibEngine(Engine):
    """fastlib's Numba kernels on the CPU (``fastlib.forward`` / ``fastlib.vjp``)."""

    name = "fastlib"
    dtypes = (FLOAT32, FLOAT64, BFLOAT16, FLOAT16)
    description = "the fast engine (Numba, CPU)"
    optimizers = _OPTIMIZER_NAMES

    @property
    def rounded_once(self):
        """fastlib's own single-rounding promises (``fastlib.ops.ROUNDED_ONCE``)."""
        from fastlib.ops import ROUNDED_ONCE

        return ROUNDED_ONCE

    @property
    def computes_in(self):
        """The 16-bit formats fastlib computes in float32, rounding once
        (``fastlib.ops.COMPUTES_IN``)."""
        from fastlib.ops import COMPUTES_IN

        return COMPUTES_IN

    def _forward(self, name, inputs, **params):
        import fastlib

        return fastlib.forward(name, inputs, **params)

    def _vjp(self, name, inputs, grad, **params):
        import fastlib

        return fastlib.vjp(name, inputs, grad, **params)

    def _value_and_vjp(self, name, inputs, grad, **params):
        from fastlib import ops

        return ops.value_and_vjp(name, inputs, grad, **params)

    def _jvp(self, name, inputs, tangents, **params):
        import fastlib

        return fastlib.jvp(name, inputs, tangents, params)

    def _hvp(self, name, inputs, cotangent, tangents, **params):
        import fastlib

        return fastlib.hvp(name, inputs, cotangent, tangents, params)

    def _optimizer_step(self, name, w, g, state, t, **hyper):
        from fastlib import optim

        opt = optim.get(name, **hyper)
        params = {"w": np.array(w, copy=True)}
        slots = {s: {"w": np.array((state or {}).get(s, np.zeros_like(params["w"])),
                                   dtype=params["w"].dtype, copy=True)}
                 for s in opt.state_names}
        self._apply_update(opt, params, {"w": np.asarray(g)}, optim.OptState(t - 1, slots))
        return params["w"], {s: slots[s]["w"] for s in opt.state_names}

    def _apply_update(self, opt, params, grads, state):
        """One optimizer step in place (the CPU kernels; the CUDA engine runs its own)."""
        opt.update(params, grads, state)


class FastlibCudaEngine(FastlibEngine):
    """fastlib's numba.cuda kernels (a GPU, or numba's simulator)."""

    name = "fastlib-cuda"
    description = "the fast engine on CUDA (numba.cuda; GPU or NUMBA_ENABLE_CUDASIM=1)"
    def __init__(self):
        import fastlib.cuda as fc

        if not fc.is_available():
            raise EngineUnavailableError(f"fastlib-cuda: {fc.unavailable_reason()}")
        self._cuda = fc

    @property
    def second_order(self):
        """False: fastlib's jvp/hvp (inherited) run on the CPU, not on the device."""
        return False

    #: fastlib's value_and_vjp (inherited) runs on the CPU, not on the device
    _value_and_vjp = None

    @property
    def rounded_once(self):
        """fastlib-cuda's own single-rounding promises (``fastlib.cuda.ops.ROUNDED_ONCE``)."""
        from fastlib.cuda.ops import ROUNDED_ONCE

        return ROUNDED_ONCE

    @property
    def computes_in(self):
        """The 16-bit formats fastlib-cuda computes in float32 (``fastlib.cuda.ops.COMPUTES_IN``)."""
        from fastlib.cuda.ops import COMPUTES_IN

        return COMPUTES_IN

    def _forward(self, name, inputs, **params):
        return self._cuda.forward(name, inputs, **params)

    def _vjp(self, name, inputs, grad, **params):
        return self._cuda.vjp(name, inputs, grad, **params)

    def _apply_update(self, opt, params, grads, state):
        self._cuda.optimizer_update(opt, params, grads, state)


def _cuda_reason():
    try:
        import fastlib.cuda as fc
    except Exception as exc:  # a broken numba install: say so instead of crashing the listing
        return f"fastlib.cuda cannot be imported: {type(exc).__name__}: {exc}"
    return None if fc.is_available() else fc.unavailable_reason()


def _package_reason(package, extra):
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install 'verigrad[{extra}]')"
    return None


@dataclass(frozen=True)
class _Registered:
    """A registry entry: how to build the engine and how to tell whether it can run here."""

    name: str
    target: str                      # "module:attribute" of the class or factory
    description: str
    reason: Callable[[], str | None]  # None when available, else why not


def _adapter(package, cls, description):
    """The entry of ``reports/conformance/adapters/<package>.py``'s ``cls``: an optional extra
    of the same name, available when ``package`` imports."""
    return _Registered(package, f"reports.conformance.adapters.{package}:{cls}", description,
                       lambda: _package_reason(package, package))


ENGINES = {
    e.name: e for e in (
        _Registered("reflib", "reports.conformance.engines:ReflibEngine",
                    ReflibEngine.description, lambda: None),
        _Registered("fastlib", "reports.conformance.engines:FastlibEngine",
                    FastlibEngine.description, lambda: None),
        _Registered("fastlib-cuda", "reports.conformance.engines:FastlibCudaEngine",
                    FastlibCudaEngine.description, _cuda_reason),
        _adapter("torch", "TorchEngine", "PyTorch (CPU) through torch.autograd"),
        _adapter("jax", "JaxEngine", "JAX (CPU, x64 enabled) through jax.vjp"),
        # the peers: other people's autograds, each an optional extra (docs/engines.md)
        _adapter("paddle", "PaddleEngine", "PaddlePaddle (CPU) through paddle.grad"),
        _adapter("tinygrad", "TinygradEngine",
                 "tinygrad through Tensor.gradient (DEV=PYTHON; DEV=CPU needs clang)"),
        _adapter("mygrad", "MygradEngine", "MyGrad through Tensor.backward"),
        _adapter("autograd", "AutogradEngine", "HIPS autograd through autograd.make_vjp"),
    )
}

#: What ``verigrad conform`` runs without ``--engines``: the project's own engines (an
#: unavailable one is listed with its reason). The adapters run when named (``--engines torch``,
#: ``--engines all``): they hold other people's engines to the same standard, and may fail it.
DEFAULT_ENGINES = ("reflib", "fastlib", "fastlib-cuda")


@dataclass(frozen=True)
class EngineStatus:
    """One row of :func:`available_engines`: name, whether it runs here, and why not."""

    name: str
    available: bool
    reason: str          # "" when available
    description: str = ""


def _import_target(target):
    """Resolve ``"module:attr"`` or ``"path/file.py:attr"`` to the object it names."""
    if ":" not in target:
        raise UnknownEngineError(f"engine {target!r}: expected 'module:Attribute'")
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise UnknownEngineError(f"engine {target!r}: expected 'module:Attribute', e.g. "
                                 f"'my_engines:MyEngine'")
    if _names_a_file(module_name):
        module = _import_file(module_name)
    else:
        module = _import_module(target, module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownEngineError(f"engine {target!r}: module {module_name!r} has no attribute "
                                 f"{attr!r}{hint}") from None


def _names_a_file(module_name):
    """Whether the part of a plugin target before ``:`` is a path, not a module name: it ends
    in ``.py``, holds a path separator, or is a file here (``engine.txt``)."""
    separators = [sep for sep in (os.sep, os.altsep) if sep]
    return (module_name.endswith(".py") or any(sep in module_name for sep in separators)
            or os.path.isfile(module_name))


def _import_file(shown):
    """The module of the plugin file ``shown`` (the path as the user typed it).

    Raises :class:`UnknownEngineError` naming what is wrong with the path (missing, a folder,
    not Python source) or what importing it raised, never the import machinery's own error.
    """
    path = os.path.abspath(shown)
    if os.path.isdir(path):
        raise UnknownEngineError(f"{shown} is a folder, not a .py file; name the plugin's "
                                 f"file: path/to/engine.py:Class")
    if not os.path.exists(path):
        raise UnknownEngineError(f"{shown}: no such file ({path})")
    if not path.endswith(".py"):
        # importlib finds no loader for any other suffix
        raise UnknownEngineError(f"{shown} is not a .py file; a plugin engine is Python "
                                 f"source: path/to/engine.py:Class")
    mod_name = "_verigrad_engine_" + os.path.splitext(os.path.basename(path))[0]
    spec_ = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec_)
    sys.modules[mod_name] = module      # the module's own dataclasses and pickles look it up
    try:
        spec_.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's file failed: say how
        del sys.modules[mod_name]
        raise UnknownEngineError(f"{shown}: cannot import it: {_import_failure(exc, path)}") \
            from None
    return module


def _import_module(target, module_name):
    """The plugin module ``module_name`` (looked up on ``sys.path`` and the current folder)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())   # `verigrad` as a console script: find local modules
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise UnknownEngineError(
                f"engine {target!r}: cannot import module {module_name!r} ({exc}); put it on "
                f"PYTHONPATH or run from its directory") from None
        failure = exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module failed: say how
        failure = exc
    raise UnknownEngineError(f"module {module_name!r}: cannot import it: "
                             f"{_import_failure(failure)}") from None


def _import_failure(exc, path=None):
    """What importing a plugin raised, in one line: a syntax error with its line (and its file
    when that is not the plugin's own, ``path``), else the exception's type and message."""
    if isinstance(exc, SyntaxError):
        where = f" at line {exc.lineno}" if exc.lineno else ""
        if exc.filename and (path is None or os.path.abspath(exc.filename) != path):
            where = f" in {exc.filename}{where}"
        return f"{type(exc).__name__}{where}: {exc.msg}"
    return f"{type(exc).__name__}: {exc}"


def check_engine(engine):
    """Validate that ``engine`` has the protocol's attributes; return it.

    Raises
    ------
    TypeError
        Naming each missing or malformed attribute (``name``, ``dtypes``, ``supports``,
        ``forward``, ``vjp``) and what it should be.
    """
    problems = []
    if not isinstance(getattr(engine, "name", None), str) or not engine.name:
        problems.append("`name` must be a non-empty str")
    dtypes = getattr(engine, "dtypes", None)
    resolved = ()
    try:
        resolved = tuple(np.dtype(d) for d in dtypes)
        if not resolved or any(d not in FORMATS for d in resolved):
            raise TypeError
    except TypeError:
        problems.append("`dtypes` must be a non-empty tuple of float32 / float64 / bfloat16 "
                        "(ml_dtypes.bfloat16) / float16")
    for method in ("supports", "forward", "vjp"):
        if not callable(getattr(engine, method, None)):
            problems.append(f"`{method}` must be a method")
    problems += _working_problems(engine, resolved)
    if problems:
        raise TypeError(f"{type(engine).__name__} is not an engine: " + "; ".join(problems)
                        + " (see docs/engines.md)")
    return engine


def _working_problems(engine, dtypes):
    """What is wrong with an engine's ``computes_in`` / ``accumulates`` declarations (each
    names a storage format the engine lists and a format at least as wide)."""
    from reports.conformance.bounds import check_working

    problems = []
    listed = {d.name for d in dtypes}
    for attr in ("computes_in", "accumulates"):
        table = getattr(engine, attr, None) or {}
        for storage, working in table.items():
            if storage not in optable.formats.STORAGE or storage not in listed:
                problems.append(f"`{attr}` names {storage!r}: name a storage format the engine "
                                f"lists in `dtypes` ({', '.join(optable.formats.STORAGE)})")
                continue
            for value in (working.values() if hasattr(working, "values") else [working]):
                try:
                    check_working(storage, value, f"`{attr}`")
                except ValueError as exc:
                    problems.append(str(exc))
    return problems


def _instantiate(obj, name):
    """An engine from a class, a zero-argument factory or an instance; checked. A class or
    factory that raises is refused as a broken plugin is, with what it raised in one line."""
    if inspect.isclass(obj) or (callable(obj) and not hasattr(obj, "forward")):
        try:
            obj = obj()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the constructor failed: say how
            raise UnknownEngineError(f"engine {name!r}: cannot build it: "
                                     f"{type(exc).__name__}: {exc}") from None
    return check_engine(obj)


def get_engine(name):
    """The engine called ``name``: a registered name or ``"module:Attribute"``.

    Parameters
    ----------
    name : str
        ``reflib``, ``fastlib``, ``fastlib-cuda``, ``torch``, ``jax``, or a plugin
        ``"my_module:MyEngine"`` / ``"path/to/file.py:MyEngine"`` (a class, factory or instance).

    Returns
    -------
    engine
        An object with ``name``, ``dtypes``, ``supports``, ``forward`` and ``vjp``.

    Raises
    ------
    UnknownEngineError
        An unknown name (the message lists close names and every registered engine).
    EngineUnavailableError
        The engine cannot run here; the message says why (a package to install, no GPU).
    TypeError
        A plugin that lacks part of the protocol.
    """
    if not isinstance(name, str):
        raise TypeError(f"engine name must be a string; got {type(name).__name__}")
    entry = ENGINES.get(name)
    if entry is None:
        if ":" in name:
            return _instantiate(_import_target(name), name)
        close = difflib.get_close_matches(name, list(ENGINES), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownEngineError(f"unknown engine {name!r}{hint} (engines: "
                                 f"{', '.join(ENGINES)}; or 'my_module:MyEngine')")
    reason = entry.reason()
    if reason:
        raise EngineUnavailableError(f"engine {name!r} is unavailable: {reason}")
    return _instantiate(_import_target(entry.target), name)


def engine_status(name):
    """:class:`EngineStatus` of one registered engine (tries to build it; never raises)."""
    entry = ENGINES.get(name)
    if entry is None:
        try:
            get_engine(name)
            return EngineStatus(name, True, "", "plugin")
        except Exception as exc:  # a plugin that fails to load is unavailable, with the reason
            return EngineStatus(name, False, f"{type(exc).__name__}: {exc}", "plugin")
    reason = entry.reason()
    if reason is None:
        try:
            get_engine(name)
        except Exception as exc:  # a broken install: unavailable, and say why
            reason = f"{type(exc).__name__}: {exc}"
    return EngineStatus(name, reason is None, reason or "", entry.description)


def available_engines(names=None):
    """Every registered engine (or ``names``) with whether it runs here and why not.

    Returns
    -------
    list of EngineStatus
        In registry order; ``reason`` is "" for available engines.

    Examples
    --------
    >>> [s.name for s in available_engines() if s.available][:2]
    ['reflib', 'fastlib']
    """
    return [engine_status(n) for n in (ENGINES if names is None else names)]
