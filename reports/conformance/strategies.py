"""Hypothesis strategies of the suite: op calls, random DAGs, models, optimizer runs.

Shapes and params come from Hypothesis, values from each op's declared domains
(``spec.sample_inputs`` with a drawn seed), so draws respect domains and shrink; the tests
import these, one copy of each strategy.

The long story: docs/reports-accuracy.md, section ``reports/conformance/strategies.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import optable

__all__ = [
    "UNARY", "BINARY", "REDUCTIONS", "ALONG_AXIS", "LAST_AXIS", "SAME_SHAPE_LOSSES",
    "ROW_LOSSES", "STRUCTURE", "op_case", "case_form", "edge_decades", "EDGE_RANGE",
    "representable",
    "OpExample", "op_examples", "make_example",
    "dags", "TAPE_EXAMPLES", "build_dag", "reached", "custom_backward", "custom_value",
    "optimizer_cases",
    "OPTIMIZER_NAMES", "LAYER_KINDS", "ModelCase", "model_cases", "mlp_cases",
]

# the op groups by shape form, read from the op table
UNARY = set(optable.names(category="unary"))
BINARY = set(optable.names(category="binary"))
REDUCTIONS = set(optable.names(category="reduction"))
ALONG_AXIS = set(optable.names(shape="along_axis"))
LAST_AXIS = set(optable.names(shape="last_axis"))
SAME_SHAPE_LOSSES = set(optable.names(shape="same_shape_loss"))
ROW_LOSSES = set(optable.names(shape="class_index_loss") + optable.names(shape="distribution_loss"))
STRUCTURE = set(optable.names(category="structure")) - {"matmul"}


# ---------------------------------------------------------------------------------------------
# op calls: shapes and params per op, values from spec's domains

def _shape(min_dims=0, max_dims=3):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=4)


@st.composite
def _axis_param(draw, ndim):
    """None, an int (maybe negative), or a tuple of distinct axes."""
    if ndim == 0:
        return draw(st.sampled_from([None, ()]))
    return draw(st.one_of(
        st.none(),
        st.integers(-ndim, ndim - 1),
        st.lists(st.integers(0, ndim - 1), unique=True, min_size=1, max_size=ndim).map(tuple)))


@st.composite
def _reshape_target(draw, shape):
    size = int(np.prod(shape, dtype=np.int64))
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    d = draw(st.sampled_from(divisors))
    target = draw(st.sampled_from([(size,), (d, size // d), (size // d, 1, d)]))
    if draw(st.booleans()):
        i = draw(st.integers(0, len(target) - 1))
        target = target[:i] + (-1,) + target[i + 1:]
    return target


@st.composite
def op_case(draw, name):
    """(shapes, params, seed) for op ``name``: every shape form and param form the op takes."""
    params = {}
    if name in UNARY:
        shapes = [draw(_shape())]
        if name == "leaky_relu":
            params["negative_slope"] = draw(st.sampled_from([0.01, 0.2, 1.5]))
    elif name in BINARY:
        bs = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3,
                                                    min_side=1, max_side=4))
        shapes = list(bs.input_shapes)
    elif name in REDUCTIONS:
        shape = draw(_shape())
        shapes = [shape]
        params = {"axis": draw(_axis_param(len(shape))), "keepdims": draw(st.booleans())}
    elif name == "matmul":
        m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
        batch = draw(_shape(0, 2))
        shared = draw(st.booleans())
        shapes = [batch + (m, k), (k, n) if shared or not batch else batch + (k, n)]
    elif name == "transpose":
        shape = draw(_shape())
        shapes = [shape]
        params = {"axes": draw(st.one_of(st.none(),
                                         st.permutations(range(len(shape))).map(tuple)))}
    elif name == "reshape":
        shape = draw(_shape())
        shapes = [shape]
        params = {"shape": draw(_reshape_target(shape))}
    elif name == "concat":
        shape = draw(_shape(1, 3))
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        other = list(shape)
        other[axis] = draw(st.integers(1, 3))
        shapes = [shape, tuple(other)]
        params = {"axis": axis}
    elif name == "slice":
        shape = draw(_shape(1, 3))
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        n = shape[axis]
        params = {"axis": axis, "start": draw(st.integers(-n, n)),
                  "stop": draw(st.one_of(st.none(), st.integers(-n, n))),
                  "step": draw(st.integers(1, 3))}
        shapes = [shape]
    elif name in ALONG_AXIS:
        shape = draw(_shape(1, 3))
        shapes = [shape]
        params = {"axis": draw(st.integers(-len(shape), len(shape) - 1))}
    elif name in LAST_AXIS:
        shapes = [draw(_shape(1, 3))]
        params = {"eps": draw(st.sampled_from([1e-5, 1e-3, 0.5]))}
    elif name in SAME_SHAPE_LOSSES:
        shape = draw(_shape(1, 2))
        shapes = [shape, shape]
    elif name in ROW_LOSSES:
        n, c = draw(st.integers(1, 4)), draw(st.integers(1, 5))
        if name == "cross_entropy":
            shapes = [(n, c), draw(st.sampled_from([(n, 1), (n,)]))]
        else:
            shapes = [(n, c), (n, c)]
    else:
        raise ValueError(f"op_case: no strategy for op {name!r}; add its shapes and params "
                         f"to reports/conformance/strategies.py")
    return shapes, params, draw(st.integers(0, 2**32 - 1))


@dataclass(frozen=True)
class OpExample:
    """One call: inputs (in the dtype under test), the cotangent, params, and how it was drawn."""

    name: str
    inputs: tuple
    grad: np.ndarray
    params: dict = field(default_factory=dict)
    seed: int = 0
    near_kinks: bool = False
    label: str = ""
    edges: bool = False

    @property
    def dtype(self):
        return self.grad.dtype


# How far the edge draws may go, per op: "full" (the dtype's whole range), "sum" (two decades
# below overflow: a sum of up to 64 terms stays finite), "square" (the square root of the
# range: ops that square or multiply their inputs, or whose VJP does), "exp" (up to the
# overflow threshold of exp). The contract of docs/CONTRACTS.md states the same ranges.
EDGE_RANGE = {name: sig.edge for name, sig in optable.OPS.items()}   # the op table's


def edge_decades(name, dtype):
    """``(lo, hi)``: the log10 range of the edge draws of op ``name`` in ``dtype``."""
    info = optable.formats.format_of(dtype)
    smallest = float(np.log10(info.smallest_subnormal))
    largest = float(np.log10(info.max))
    kind = EDGE_RANGE[name]
    if kind == "full":
        return smallest, largest - 0.5
    if kind == "sum":
        return smallest, largest - 2.0
    if kind == "exp":
        return smallest, float(np.log10(np.log(float(info.max)))) - 0.01
    if kind == "cube":
        return smallest, largest / 3 - 1.0
    # "square": both the value and its square (and a product of two) stay normal numbers
    return float(np.log10(info.tiny)) / 2 + 0.5, largest / 2 - 1.5


def _edge_values(x, domain, name, dtype, rng):
    """Replace the float values of ``x`` (from ``domain``) by edge draws of the same shape."""
    x = np.array(x, dtype=np.float64)
    shape = x.shape
    lo, hi = edge_decades(name, dtype)
    info = optable.formats.format_of(dtype)
    if domain in ("real", "nonzero", "positive"):
        mag = 10.0 ** rng.uniform(lo, hi, size=shape)
        sign = 1.0 if domain == "positive" else rng.choice([-1.0, 1.0], size=shape)
        return np.asarray(sign * mag)
    if domain == "unit_open":
        # close to 0 or to 1 (as close as the dtype has numbers below 1)
        near = 10.0 ** rng.uniform(max(lo, -300.0), -0.5, size=shape)
        # epsneg (the gap below 1) is the unit roundoff 2**-p in every binary format
        gap = 10.0 ** rng.uniform(np.log10(info.unit_roundoff), -0.5, size=shape)
        v = np.where(rng.random(shape) < 0.5, near, 1.0 - gap)
        v = np.asarray(v).astype(dtype).astype(np.float64)
        below_one = 1.0 - info.unit_roundoff
        return np.clip(v, info.smallest_subnormal, below_one)
    if domain == "distribution" and x.ndim and x.shape[-1] > 1:
        # rows that miss 1 by up to 0.9 of the validator's 1e-3, in the dtype (where the
        # format cannot hold a row that close to 1, bfloat16, the row is kept as drawn)
        scale = 1.0 + rng.uniform(-9e-4, 9e-4, size=shape[:-1] + (1,))
        moved = (x * scale).astype(dtype).astype(np.float64)
        near = np.abs(moved.sum(axis=-1, keepdims=True) - 1.0) <= 9e-4
        return np.asarray(np.where(near, moved, x))
    return x


def representable(x, domain, dtype):
    """``x`` (float64, drawn from ``domain``) made exact in ``dtype`` where the cast alone would
    leave the domain: distribution rows are multiples of 1/1024 (spec's samplers), which
    bfloat16's 8 bits cannot hold; there each row is requantised to multiples of ``2**(p-1)``
    (1/128) that still sum to exactly 1."""
    quantum = 2.0 ** (optable.formats.format_of(dtype).precision - 1)
    x = np.asarray(x, dtype=np.float64)
    if domain != "distribution" or quantum >= 1024 or x.ndim == 0 or x.shape[-1] < 1:
        return x
    counts = np.floor(x * quantum)
    counts[..., -1] = quantum - counts[..., :-1].sum(axis=-1)
    return counts / quantum


def make_example(name, shapes, params, seed, dtype, near_kinks=False, edges=False):
    """Draw the values of an op call from ``seed``: inputs from spec's domains, then ``grad``.

    Class indices stay int64; every other input and the cotangent are cast to ``dtype`` (the
    samplers keep values at least 1e-2 from every kink, so the cast cannot cross one). With
    ``edges`` the real inputs are log-uniform across the dtype's range (``edge_decades``).
    """
    import spec

    op = spec.OPS[name]
    rng = np.random.default_rng(seed)
    raw = spec.sample_inputs(name, rng, shapes=shapes, params=params, near_kinks=near_kinks)
    raw = [representable(x, op.domains[n], dtype) if op.domains[n] != "class_index" else x
           for n, x in zip(op.inputs, raw)]
    if edges:
        raw = [_edge_values(x, op.domains[n], name, np.dtype(dtype), rng)
               if op.domains[n] != "class_index" else x for n, x in zip(op.inputs, raw)]
        if near_kinks:   # keep the kinks where the sampler put them (0, or a == b)
            raw = spec.samples._apply_kinks(op, dict(zip(op.inputs, raw)), rng, True)
            raw = [np.asarray(raw[n]) for n in op.inputs]
    inputs = tuple(x if op.domains[n] == "class_index" else np.asarray(x).astype(dtype)
                   for n, x in zip(op.inputs, raw))
    out_shape = op.check_shapes([np.shape(x) for x in inputs], params)
    grad = rng.standard_normal(out_shape).astype(dtype)
    return OpExample(name, inputs, np.asarray(grad), dict(params), int(seed), near_kinks,
                     "edge magnitudes" if edges else "", edges)


@st.composite
def op_examples(draw, name, dtype, near_kinks=False, edges=None):
    """An :class:`OpExample` of op ``name`` in ``dtype`` (optionally with values on its kinks).

    ``edges=None`` draws it: half of the examples take their magnitudes across the dtype's
    range (``make_example``), the other half from the op's domains.
    """
    shapes, params, seed = draw(op_case(name))
    if edges is None:
        edges = draw(st.booleans())
    return make_example(name, shapes, params, seed, np.dtype(dtype), near_kinks, edges)


def case_form(ex):
    """A short name of the *form* of call ``ex``: what a distinct failure differs in.

    Rank (``0-d`` when any input is), broadcasting, the axis param's form, kinks and the
    magnitude source: two failures of one form are likely one bug, two forms two bugs.
    """
    shapes = [np.shape(x) for x in ex.inputs]
    parts = ["0-d" if any(len(s) == 0 for s in shapes) else f"{max(len(s) for s in shapes)}-d"]
    float_shapes = {s for s, x in zip(shapes, ex.inputs)
                    if optable.formats.is_float(np.asarray(x).dtype)}
    if ex.name in BINARY and len(float_shapes) > 1:
        parts.append("broadcast")
    if "axis" in ex.params:
        axis = ex.params["axis"]
        parts.append("axis=" + ("None" if axis is None else "()" if axis == () else
                                "int" if isinstance(axis, (int, np.integer)) else "tuple"))
    if ex.near_kinks:
        parts.append("on kinks")
    parts.append("edge magnitudes" if getattr(ex, "edges", False) else "domain values")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# random DAGs for the tape laws

DAG_SHAPES = [(), (3,), (2, 3)]
# no exp: a chain of exps overflows; squares stay finite in float64 (2**(2**8) < 1e308)
DAG_UNARY = ["neg", "identity", "square", "tanh", "sigmoid", "softplus", "silu", "gelu"]
DAG_BINARY = ["add", "sub", "mul"]
_MOSTLY_TRUE = st.sampled_from([True, True, True, False])


def custom_backward(kind, pid, qid, p, q, calls, node_id):
    """backward(cotangent) -> [(parent, contribution)]: plain NumPy, so it runs on both tapes."""

    def backward(g):
        calls.append(node_id)
        if kind == "scale":
            return [(pid, 2 * g)]
        if kind == "twice":  # the same parent twice: the two contributions must be summed
            return [(pid, g), (pid, g)]
        return [(pid, g * q), (qid, g * p)]

    return backward


def custom_value(kind, p, q):
    """The value of a custom node of ``kind`` on parent values ``p``, ``q``."""
    return {"scale": 2 * p, "twice": p + p, "prod": p * q}[kind]


@st.composite
def dags(draw, with_ops=True, integer=False):
    """A DAG: leaves, registry ops and custom nodes over one shape; parents from any earlier
    node (diamonds, shared subexpressions, a parent used twice); an output anywhere, so nodes
    after it and side branches are unreached. Returns ``(nodes, out)``."""
    shape = draw(st.sampled_from(DAG_SHAPES))
    size = int(np.prod(shape))
    element = st.integers(-3, 3) if integer else st.floats(-2, 2, allow_subnormal=False)
    nodes = []
    for _ in range(draw(st.integers(1, 3))):
        v = np.array(draw(st.lists(element, min_size=size, max_size=size)),
                     dtype=np.float64).reshape(shape)
        nodes.append(("leaf", v, draw(_MOSTLY_TRUE)))
    for _ in range(draw(st.integers(1, 8))):
        parent = st.one_of(st.just(len(nodes) - 1), st.integers(0, len(nodes) - 1))
        kind = draw(st.sampled_from(["custom", "unary", "binary"] if with_ops else ["custom"]))
        if kind == "custom":
            sub = draw(st.sampled_from(["scale", "twice", "prod"]))
            nodes.append(("custom", sub, (draw(parent), draw(parent)), draw(_MOSTLY_TRUE)))
        elif kind == "unary":
            nodes.append(("op", draw(st.sampled_from(DAG_UNARY)), (draw(parent),)))
        else:
            nodes.append(("op", draw(st.sampled_from(DAG_BINARY)), (draw(parent), draw(parent))))
    out = draw(st.integers(0, len(nodes) - 1))
    return nodes, out


def _leaf(values, requires_grad=True):
    return ("leaf", np.array(values, dtype=np.float64), requires_grad)


#: DAGs every tape-law run starts with (then Hypothesis draws more): a leaf that does not
#: require grad feeding an op and a custom node; a diamond whose shared parent is reached twice
#: and a node after the output; a custom node sending to the same parent twice, beside an
#: unreached side branch.
TAPE_EXAMPLES = (
    ([_leaf([1.0, -2.0, 0.5]), _leaf([0.25, 3.0, -1.0], False), ("op", "mul", (0, 1)),
      ("custom", "prod", (1, 2), True), ("op", "add", (3, 0))], 4),
    ([_leaf([[0.5, -1.5, 2.0], [1.0, 0.0, -0.25]]), ("op", "tanh", (0,)), ("op", "square", (0,)),
      ("op", "mul", (1, 2)), ("op", "sub", (3, 1)), ("op", "neg", (4,))], 4),
    ([_leaf(1.5), _leaf(-0.5), ("custom", "twice", (0, 1), True), ("op", "sigmoid", (1,)),
      ("custom", "scale", (2, 2), True)], 4),
)


def build_dag(tape, nodes):
    """Record ``nodes`` on ``tape``; return the list of custom-backward calls (node ids)."""
    calls = []
    for entry in nodes:
        if entry[0] == "leaf":
            tape.leaf(entry[1], requires_grad=entry[2])
        elif entry[0] == "op":
            tape.op(entry[1], *entry[2])
        else:
            _, sub, (pid, qid), rg = entry
            p, q = np.asarray(tape.value(pid)), np.asarray(tape.value(qid))
            node_id = len(tape)
            tape.node(custom_value(sub, p, q), (pid, qid),
                      custom_backward(sub, pid, qid, p, q, calls, node_id), requires_grad=rg)
    return calls


def reached(nodes, out):
    """Ids reached from ``out`` by the traversal rules, written out independently: a node
    propagates when it is reached and requires grad; a parent receives when it requires grad."""
    requires = []
    for entry in nodes:
        if entry[0] == "leaf":
            requires.append(entry[2])
        elif entry[0] == "op":
            requires.append(any(requires[p] for p in entry[2]))
        else:
            requires.append(entry[3])
    hit = {out}
    for i in range(out, -1, -1):
        if i in hit and requires[i] and nodes[i][0] != "leaf":
            sends_to = nodes[i][2]
            if nodes[i][0] == "custom" and nodes[i][1] != "prod":
                sends_to = sends_to[:1]  # scale and twice send to their first parent only
            hit.update(p for p in sends_to if requires[p])
    return hit


# ---------------------------------------------------------------------------------------------
# optimizer runs

OPTIMIZER_NAMES = tuple(optable.OPTIMIZERS)
# where each hyperparameter is drawn: inside its legal range (optable.OPTIMIZERS), away from
# the ends where an optimizer stops moving (beta = 1) or divides by almost nothing
HYPERPARAMETER_DRAWS = {"lr": (1e-4, 1.0), "beta": (0.0, 0.99), "gamma": (0.0, 0.99),
                        "beta1": (0.0, 0.99), "beta2": (0.5, 0.9999), "eps": (1e-8, 1e-2),
                        "weight_decay": (0.0, 0.5)}


@st.composite
def optimizer_cases(draw, names=OPTIMIZER_NAMES):
    """``(name, shape, seed, hyper)``: an optimizer with random (non-default) hyperparameters."""
    name = draw(st.sampled_from(list(names)))
    shape = draw(st.sampled_from([(1,), (5,), (2, 3), (3, 1, 2)]))
    seed = draw(st.integers(0, 2**31 - 1))
    return name, shape, seed, {h.name: draw(st.floats(*HYPERPARAMETER_DRAWS[h.name]))
                               for h in optable.OPTIMIZERS[name].hyper}


# ---------------------------------------------------------------------------------------------
# models of every layer type (configs shared by fastlib and reflib)

LAYER_KINDS = ("Dense", "RNN", "LSTM", "MultiHeadAttention", "SwiGLU", "LayerNorm", "RMSNorm",
               "Embedding", "Softmax", "Parallel", "Sequential")
# the op table's activations but softmax (a layer kind of its own here)
ACTIVATIONS = tuple(n for n in optable.ACTIVATIONS if n != "softmax")
LOSSES_2D = ("mse", "cross_entropy", "categorical_cross_entropy", "binary_cross_entropy",
             "binary_cross_entropy_with_logits")
LOSSES_3D = ("mse", "binary_cross_entropy", "binary_cross_entropy_with_logits")


@dataclass(frozen=True)
class ModelCase:
    """A model config, its input batch, targets and loss, and the seed of its parameters."""

    config: dict
    x: np.ndarray
    y: np.ndarray
    loss: str
    seed: int
    kinds: frozenset


def layer_block(draw, kind, width, rank, activations, kinds=None, most_hidden=4,
                heads=(1, 2, 3)):
    """One block of ``kind`` (any layer kind but Sequential) mapping (..., width): returns
    (config, out width, out rank), or None for a Sequential (each caller nests its own).

    ``activations`` are the Dense activations drawn from; ``kinds`` (a set) collects the layer
    kinds drawn; ``most_hidden`` bounds SwiGLU's hidden width and ``heads`` lists the head
    counts attention may take.
    """
    if kinds is not None:
        kinds.add(kind)
    if kind == "Dense":
        out = draw(st.integers(1, 4))
        return {"type": "Dense", "in_features": width, "out_features": out,
                "activation": draw(st.sampled_from(activations))}, out, rank
    if kind in ("LayerNorm", "RMSNorm"):
        return {"type": kind, "d": width, "eps": draw(st.sampled_from([1e-5, 1e-3]))}, width, rank
    if kind == "SwiGLU":
        out = draw(st.integers(1, 3))
        return {"type": "SwiGLU", "d": width, "hidden": draw(st.integers(1, most_hidden)),
                "out": out}, out, rank
    if kind in ("RNN", "LSTM"):
        hidden = draw(st.integers(1, 3))
        seqs = draw(st.booleans())
        return {"type": kind, "input_size": width, "hidden_size": hidden,
                "return_sequences": seqs}, hidden, (3 if seqs else 2)
    if kind == "MultiHeadAttention":
        heads = draw(st.sampled_from([h for h in heads if width % h == 0]))
        return {"type": kind, "d_model": width, "heads": heads,
                "causal": draw(st.booleans())}, width, rank
    if kind == "Parallel":
        combine = draw(st.sampled_from(["concat", "add"]))
        common = draw(st.integers(1, 3))
        branches, widths = [], []
        for _ in range(draw(st.integers(1, 2))):
            out = draw(st.integers(1, 3)) if combine == "concat" else common
            if kinds is not None:
                kinds.add("Dense")
            branches.append({"type": "Dense", "in_features": width, "out_features": out,
                             "activation": draw(st.sampled_from(activations))})
            widths.append(out)
        return ({"type": "Parallel", "combine": combine, "layers": branches},
                sum(widths) if combine == "concat" else common, rank)
    if kind == "Sequential":
        return None
    raise ValueError(f"no block builder for layer kind {kind!r}")


def _block(draw, kind, width, rank, depth, kinds):
    """One block of ``kind`` mapping (..., width): returns (config, out width, out rank)."""
    block = layer_block(draw, kind, width, rank, ACTIVATIONS, kinds)
    if block is not None:
        return block
    layers, out = [], width
    for _ in range(draw(st.integers(1, 2))):
        cfg, out, rank = _any_block(draw, out, rank, depth + 1, kinds)
        layers.append(cfg)
    return {"type": "Sequential", "layers": layers}, out, rank


def _any_block(draw, width, rank, depth, kinds):
    """A block of a random kind that fits the current rank (sequence layers need 3-D input)."""
    options = ["Dense", "LayerNorm", "RMSNorm", "SwiGLU"]
    if depth < 1:
        options += ["Parallel", "Sequential"]
    if rank == 3:
        options += ["RNN", "LSTM", "MultiHeadAttention"]
    return _block(draw, draw(st.sampled_from(options)), width, rank, depth, kinds)


@st.composite
def model_cases(draw, focus=None):
    """A random small model (every layer type reachable) with a batch, targets and a loss.

    ``focus`` (a name of ``LAYER_KINDS``) forces that layer type into the model, so that a
    check per layer type covers it whatever the profile's example count.
    """
    kinds = set()
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if focus == "Embedding":
        start = "tokens"
    elif focus in ("RNN", "LSTM", "MultiHeadAttention"):
        start = draw(st.sampled_from(["seq", "tokens"]))
    else:
        start = draw(st.sampled_from(["flat", "seq", "tokens"]))
    batch, seq = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    width = draw(st.integers(1, 4))
    layers = []
    if start == "tokens":
        num = draw(st.integers(2, 6))
        layers.append({"type": "Embedding", "num": num, "dim": width})
        kinds.add("Embedding")
        x = rng.integers(0, num, size=(batch, seq))
        rank = 3
    else:
        rank = 2 if start == "flat" else 3
        x = rng.uniform(-2, 2, size=(batch, width) if rank == 2 else (batch, seq, width))
    if focus not in (None, "Embedding", "Softmax"):
        cfg, width, rank = _block(draw, focus, width, rank, 0, kinds)
        layers.append(cfg)
    for _ in range(draw(st.integers(0, 2))):
        cfg, width, rank = _any_block(draw, width, rank, 0, kinds)
        layers.append(cfg)
    classes = draw(st.integers(2, 3))
    layers.append({"type": "Dense", "in_features": width, "out_features": classes,
                   "activation": "linear"})
    kinds.update(("Dense", "Sequential"))
    if focus == "Softmax":
        layers.append({"type": "Softmax", "axis": -1})
        kinds.add("Softmax")
        loss = "mse"
    else:
        loss = draw(st.sampled_from(LOSSES_2D if rank == 2 else LOSSES_3D))
    if loss == "binary_cross_entropy":   # probabilities: the last Dense ends in a sigmoid
        layers[-1]["activation"] = "sigmoid"
    out_shape = (batch, classes) if rank == 2 else (batch, seq, classes)
    y = _targets(rng, loss, batch, classes, out_shape)
    return ModelCase({"type": "Sequential", "layers": layers}, x, y, loss, seed,
                     frozenset(kinds))


def _targets(rng, loss, batch, classes, out_shape):
    """Targets in the format ``loss`` expects, for outputs of ``out_shape``."""
    if loss == "cross_entropy":
        return rng.integers(0, classes, size=(batch, 1))
    if loss == "categorical_cross_entropy":
        return np.eye(classes)[rng.integers(0, classes, size=batch)]
    if loss in ("binary_cross_entropy", "binary_cross_entropy_with_logits"):
        return rng.integers(0, 2, size=out_shape).astype(np.float64)
    return rng.uniform(-1, 1, size=out_shape)


# what fastlib.train runs in its whole-epoch fused path (fastlib.training.mlp_schedule): a flat
# Sequential of Dense layers with these activations, trained on these losses
FUSED_MLP_ACTIVATIONS = ("linear", "relu", "leaky_relu", "tanh", "sigmoid")
FUSED_MLP_LOSSES = ("mse", "cross_entropy", "categorical_cross_entropy",
                    "binary_cross_entropy_with_logits")


def dense_chain(draw, activations, most_hidden):
    """(input width, classes, Dense configs) of an MLP: 0 to ``most_hidden`` hidden layers 1-6
    wide with ``activations``, then a linear layer to 2 or 3 classes."""
    widths = [draw(st.integers(1, 5))]
    layers = []
    for _ in range(draw(st.integers(0, most_hidden))):
        widths.append(draw(st.integers(1, 6)))
        layers.append({"type": "Dense", "in_features": widths[-2], "out_features": widths[-1],
                       "activation": draw(st.sampled_from(activations))})
    classes = draw(st.integers(2, 3))
    layers.append({"type": "Dense", "in_features": widths[-1], "out_features": classes,
                   "activation": "linear"})
    return widths[0], classes, layers


@st.composite
def mlp_cases(draw):
    """A plain MLP of 1-4 Dense layers, 1-6 wide (a width of 1 leaves a piece of the fused
    epoch's layout empty), batches of 1-4 rows: the models the fused epoch trains."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    width, classes, layers = dense_chain(draw, FUSED_MLP_ACTIVATIONS, 3)
    batch = draw(st.integers(1, 4))
    loss = draw(st.sampled_from(FUSED_MLP_LOSSES))
    x = rng.uniform(-2, 2, size=(batch, width))
    y = _targets(rng, loss, batch, classes, (batch, classes))
    return ModelCase({"type": "Sequential", "layers": layers}, x, y, loss, seed,
                     frozenset(("Dense", "Sequential")))
