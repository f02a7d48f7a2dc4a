"""Ready-to-paste reproductions of failing cases: short Python snippets that rebuild the case
exactly (arrays printed with every digit) and run the same check again."""
from __future__ import annotations

import numpy as np

__all__ = ["literal", "op_call", "special", "edge", "optimizer", "tape", "train"]

_HEADER = ("import ml_dtypes\nimport numpy as np\n"
           "from reports.conformance import engines, properties\n")


def dtype_expr(dtype):
    """Python source naming ``dtype`` (``np.float32``; bfloat16 is ``ml_dtypes.bfloat16``)."""
    name = np.dtype(dtype).name
    return "ml_dtypes.bfloat16" if name == "bfloat16" else f"np.{name}"


def literal(x):
    """Python source that rebuilds ``x`` exactly (arrays with dtype, floats round-tripping)."""
    import optable

    if isinstance(x, np.ndarray):
        is_float = optable.formats.is_float(x.dtype)
        body = repr(x.tolist()) if not is_float else repr(np.asarray(x, np.float64).tolist())
        if is_float and not np.all(np.isfinite(np.asarray(x, np.float64))):
            body = body.replace("nan", "float('nan')").replace("inf", "float('inf')")
        return f"np.array({body}, dtype={dtype_expr(x.dtype)})"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(literal(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {literal(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return repr(x.item())
    if isinstance(x, (frozenset, set)):
        return repr(sorted(x))
    return repr(x)


def _engine_line(engine):
    return f"engine = engines.get_engine({engine!r})\n"


def op_call(engine, ex, check, seed=None, kinks=None):
    """A snippet that rebuilds the op call ``ex``, runs ``properties.<check>`` on it and prints
    the worst element of each failing array (index, inputs there, engine value, exact value,
    error and bound)."""
    extra = "" if seed is None else f", {seed}"
    if kinks is not None and check == "check_call":
        extra += f", {kinks!r}"
    return (_HEADER + "from reports.conformance.strategies import OpExample\n"
            + _engine_line(engine)
            + f"ex = OpExample({ex.name!r}, {literal(tuple(ex.inputs))},\n"
              f"               {literal(ex.grad)}, {literal(ex.params)}, "
              f"edges={bool(getattr(ex, 'edges', False))})\n"
            + f"result = properties.{check}(engine, ex{extra})\n"
            + "print(result.describe().replace('; ', '\\n') or result)\n")


def _listed_case(engine, ex, index, kinks, module, function, shown):
    """A snippet that picks case ``index`` of ``module.function(name, dtype)`` for ``ex``'s op,
    checks it and prints ``shown`` (an expression of ``ex``)."""
    extra = "" if kinks is None else f", {kinks!r}"
    return (_HEADER + f"from reports.conformance.{module} import {function}\n"
            + _engine_line(engine)
            + f"ex = {function}({ex.name!r}, {dtype_expr(ex.dtype)})[{index}]"
              f"   # {ex.label}\n"
            + f"result = properties.check_call(engine, ex{extra})\n"
            + f"print({shown})\n"
            + "print(result.describe().replace('; ', '\\n') or result)\n")


def special(engine, ex, index, kinks=None):
    """A snippet that picks special-values case ``index`` of ``ex``'s op and checks it."""
    return _listed_case(engine, ex, index, kinks, "special_values", "special_cases",
                        "ex.label, ex.inputs")


def edge(engine, ex, index, kinks=None):
    """A snippet that picks edge case ``index`` (``edge_cases``) of ``ex``'s op and checks it."""
    return _listed_case(engine, ex, index, kinks, "edge_cases", "edge_cases",
                        "ex.label, ex.params, [np.shape(x) for x in ex.inputs]")


def nonfinite(engine, ex):
    """A snippet that checks the non-finite contract on ``ex``'s op."""
    return (_HEADER + "from reports.conformance.special_values import nonfinite_cases\n"
            + _engine_line(engine)
            + f"ex = nonfinite_cases({ex.name!r}, {dtype_expr(ex.dtype)})[0]\n"
            + "print(ex.inputs, properties.check_nonfinite(engine, ex))\n")


def optimizer(engine, case, dtype, steps):
    """A snippet that replays an optimizer trajectory check."""
    name, shape, seed, hyper = case
    return (_HEADER + _engine_line(engine)
            + f"rng = np.random.default_rng({seed})\n"
            + f"w0 = rng.standard_normal({shape!r})\n"
            + f"grads = [rng.standard_normal({shape!r}) for _ in range({steps})]\n"
            + f"print(properties.check_optimizer(engine, {name!r}, w0, grads, {hyper!r}, "
              f"np.{np.dtype(dtype).name}))\n")


def tape(engine, case):
    """A snippet that rebuilds the random DAG and checks the tape laws."""
    (nodes, out), seed = case
    return ("import numpy as np\nfrom reports.conformance import properties\n"
            + f"nodes = {literal(list(nodes))}\n"
            + f"print(properties.check_tape_laws({engine!r}, (nodes, {out}), {seed}))\n")


def train(case):
    """A snippet that rebuilds the model case and checks the training step."""
    model, optimizer_name, lr = case
    return ("import numpy as np\nfrom reports.conformance import training_rows\n"
            + "from reports.conformance.strategies import ModelCase\n"
            + f"case = ModelCase({literal(model.config)},\n    {literal(model.x)},\n"
              f"    {literal(model.y)}, {model.loss!r}, {model.seed}, "
              f"frozenset({literal(model.kinds)}))\n"
            + f"print(training_rows.check_train_step(case, {optimizer_name!r}, {lr!r}))\n")
