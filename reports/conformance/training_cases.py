"""Training runs to check: models of every layer type, whole epochs, and the sizes that cross
the boundaries of fastlib's kernels.

The long story: docs/reports-training-checks.md, section ``reports/conformance/training_cases.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from hypothesis import strategies as st

import optable
from reports.conformance.strategies import dense_chain, layer_block

__all__ = ["EpochCase", "moved_parameters", "tolerance_targets", "epoch_cases", "fused_cases", "recurrent_cases", "attention_cases",
           "boundary_cases", "kernel_boundaries", "OPTIMIZERS", "LAYER_KINDS", "mixed_cases",
           "loss_scale_cases", "kinked_cases", "KINKED"]

OPTIMIZERS = tuple(optable.OPTIMIZERS)
LAYER_KINDS = ("Dense", "RNN", "LSTM", "MultiHeadAttention", "SwiGLU", "LayerNorm", "RMSNorm",
               "Embedding", "Softmax", "Parallel", "Sequential")
# smooth activations only: a pre-activation that the engine's rounding moves across a relu
# kink changes a gradient by O(1), which is not an accuracy error (the kinks' conventions have
# their own rows)
SMOOTH = tuple(n for n, a in optable.ACTIVATIONS.items()
               if a.op != "softmax" and not optable.OPS[a.op].kinks)
# ... and the kinked ones, held where no pre-activation comes near a kink (kinked_cases)
KINKED = tuple(n for n, a in optable.ACTIVATIONS.items() if optable.OPS[a.op].kinks)
# the compiled paths' Dense activations are the op table's elementwise ones
# (fastlib.kernels.instructions.ELEMENTWISE_ACTIVATIONS): every smooth activation but softmax
FUSED_SMOOTH = tuple(n for n in SMOOTH if optable.OPS[optable.ACTIVATIONS[n].op].category ==
                     "unary")


@dataclass(frozen=True)
class EpochCase:
    """One ``fastlib.train`` call and what it must do.

    ``clip`` is a fraction: the threshold is that fraction of the first batch's exact gradient
    (its largest entry for ``"value"``, its global norm for ``"norm"``), rounded to float32, so
    clipping is active and the threshold is a number both dtypes hold exactly. ``path`` is
    ``"fused"`` (must take the whole-epoch fused path), ``"pieces"`` (the same, cut into
    ``pieces`` pieces, default :data:`PIECES_PATH_PLAN`, whatever the size), ``"compiled"``
    (must take a whole-epoch compiled path: the attention models'), ``"general"`` (must take
    the general schedule, the other schedules set aside: an MLP in the interpreter),
    ``"generic"`` (``fused=False``: the per-batch loop) or ``"cuda"`` (``device="cuda"``:
    fastlib-cuda).
    """

    config: dict
    x: np.ndarray
    y: np.ndarray
    loss: str
    seed: int
    dtype: str = "float64"
    optimizer: str = "SGD"
    lr: float = 0.05
    batch_size: int = 2
    epochs: int = 2
    shuffle: bool = True
    clip: float = 0.0
    clip_mode: str = "value"
    path: str = "generic"
    label: str = ""
    referee: str = "exact"     # "exact" (reflib at 30 digits) or "float64" (large float32 runs)
    moved: bool = False        # start from parameters moved off their initial values
    pieces: int | None = None  # the compiled path's piece plan (None: the machine's choice)
    mixed: str | None = None   # a 16-bit format: trained in mixed precision over float32
    loss_scale: dict | None = None  # with mixed float16: LossScale's fields (None: unscaled)

    def with_(self, **changes):
        """A copy with ``changes`` applied."""
        return replace(self, **changes)


# the piece plan of the "pieces" path's cases (an MLP cut into three column pieces: widths of
# 1-6 leave some pieces empty)
PIECES_PATH_PLAN = 3


def kernel_boundaries():
    """The kernels' block and piece sizes, read now from the modules that define them."""
    from fastlib import config
    from fastlib.kernels import recurrent, reduce, skeleton
    from fastlib.training import general_schedule, mlp_schedule

    # the layers' cell groups and the compiled pieces' most sequences are one constant, and
    # every compiled program's update blocks one other
    return {"recurrent_piece": int(recurrent.PIECE), "reduce_block": int(reduce._BLOCK),
            "split_min_params": int(mlp_schedule.SPLIT_MIN_PARAMS),
            "min_piece_params": int(mlp_schedule.MIN_PIECE_PARAMS),
            "parallel_min_size": int(config.PARALLEL_MIN_SIZE),
            "compiled_recurrent_piece": int(recurrent.PIECE),
            "compiled_recurrent_block": int(skeleton.BLOCK),
            "attention_min_piece_rows": int(general_schedule.MIN_PIECE_ROWS),
            "attention_chunk_min_params": int(skeleton.BLOCK)}


# ---------------------------------------------------------------------------------------------
# models

def _block(draw, kind, width, rank):
    """(config, out width, out rank) of one block of ``kind`` on (..., width) inputs, with
    smooth activations; a Sequential nests a Parallel or a norm and a Dense."""
    block = layer_block(draw, kind, width, rank, SMOOTH, most_hidden=3, heads=(1, 2))
    if block is not None:
        return block
    inner, w = [], width
    for k in (draw(st.sampled_from(["Parallel", "LayerNorm", "SwiGLU"])), "Dense"):
        cfg, w, rank = _block(draw, k, w, rank)
        inner.append(cfg)
    return {"type": "Sequential", "layers": inner}, w, rank


def moved_parameters(params, seed, dtype):
    """``params`` each moved by a uniform draw in [-0.5, 0.5) (rounded to ``dtype``): a
    LayerNorm / RMSNorm weight leaves 1 and a bias 0, where a backward that forgets the affine
    weight or the bias is exact; recurrent and attention weights leave their initial draw."""
    rng = np.random.default_rng([seed, 7])
    return {k: (np.asarray(v, np.float64) + rng.uniform(-0.5, 0.5, np.shape(v))).astype(dtype)
            for k, v in sorted(params.items())}


def tolerance_targets(rng, batch, classes):
    """One-hot rows scaled so each misses summing to 1 by up to 0.9 of the training
    validator's tolerance (``fastlib.losses``; reflib's is the same): targets a loss must take
    as they are, with its gradient's ``Σ target`` (docs/CONTRACTS.md)."""
    from fastlib.losses import _ROW_SUM_TOL

    miss = rng.uniform(-0.9, 0.9, size=(batch, 1)) * _ROW_SUM_TOL
    return np.eye(classes)[rng.integers(0, classes, size=batch)] * (1.0 + miss)


def _targets(rng, loss, classes, out_shape):
    batch = out_shape[0]
    if loss == "cross_entropy":
        return rng.integers(0, classes, size=(batch, 1))
    if loss == "categorical_cross_entropy":
        return tolerance_targets(rng, batch, classes)
    if loss in ("binary_cross_entropy", "binary_cross_entropy_with_logits"):
        return rng.integers(0, 2, size=out_shape).astype(np.float64)
    return rng.uniform(-1, 1, size=out_shape)


def _options(draw, n):
    """Optimizer, rate, batch size (a partial last batch most of the time), clipping."""
    optimizer = draw(st.sampled_from(OPTIMIZERS))
    lr = draw(st.sampled_from([0.01, 0.05]))
    batch = draw(st.sampled_from(sorted({max(1, n // 2), max(1, n - 1), 2, n})))
    clip_mode = draw(st.sampled_from(["value", "norm"]))
    clip = draw(st.sampled_from([0.0, 0.5, 0.8]))
    return dict(optimizer=optimizer, lr=lr, batch_size=batch, clip=clip, clip_mode=clip_mode,
                shuffle=draw(st.sampled_from([True, True, False])))


@st.composite
def epoch_cases(draw, focus, dtype="float64"):
    """A small model around one layer of ``focus`` (every type of ``LAYER_KINDS``) trained for
    two whole epochs by the generic per-batch loop."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(3, 7))
    seq = draw(st.integers(1, 3))
    width = draw(st.integers(1, 4))
    if focus == "MultiHeadAttention":
        width = draw(st.sampled_from([2, 4]))
    layers = []
    if focus == "Embedding" or (focus in ("RNN", "LSTM", "MultiHeadAttention")
                                and draw(st.booleans())):
        num = draw(st.integers(2, 5))
        layers.append({"type": "Embedding", "num": num, "dim": width})
        x = rng.integers(0, num, size=(n, seq))
        rank = 3
    else:
        rank = 3 if focus in ("RNN", "LSTM", "MultiHeadAttention") or draw(st.booleans()) else 2
        x = rng.uniform(-2, 2, size=(n, width) if rank == 2 else (n, seq, width))
    if focus in ("LayerNorm", "RMSNorm"):
        # a Dense in front, so the norm's input gradient is held too (a norm first in the
        # model hands its input gradient to nobody)
        layers.append({"type": "Dense", "in_features": width, "out_features": width,
                       "activation": draw(st.sampled_from(SMOOTH))})
    if focus not in ("Embedding", "Softmax"):
        cfg, width, rank = _block(draw, focus, width, rank)
        layers.append(cfg)
    classes = draw(st.integers(2, 3))
    layers.append({"type": "Dense", "in_features": width, "out_features": classes,
                   "activation": "linear"})
    out_shape = (n, classes) if rank == 2 else (n, seq, classes)
    if focus == "Softmax":
        layers.append({"type": "Softmax", "axis": -1})
        loss = "mse"
    elif rank == 2:
        loss = draw(st.sampled_from(["mse", "cross_entropy", "categorical_cross_entropy",
                                     "binary_cross_entropy_with_logits"]))
    else:
        loss = draw(st.sampled_from(["mse", "binary_cross_entropy_with_logits"]))
    y = _targets(rng, loss, classes, out_shape)
    return EpochCase({"type": "Sequential", "layers": layers}, x, y, loss, seed, dtype,
                     path="generic", label=f"{focus}", moved=True, **_options(draw, n))


@st.composite
def fused_cases(draw, dtype="float64", path="fused"):
    """A plain MLP (the models the fused epoch trains), 1-3 Dense layers, widths 1-6."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    width, classes, layers = dense_chain(draw, FUSED_SMOOTH, 2)
    n = draw(st.integers(3, 9))
    loss = draw(st.sampled_from(["mse", "cross_entropy", "categorical_cross_entropy",
                                 "binary_cross_entropy_with_logits"]))
    x = rng.uniform(-2, 2, size=(n, width))
    y = _targets(rng, loss, classes, (n, classes))
    return EpochCase({"type": "Sequential", "layers": layers}, x, y, loss, seed, dtype,
                     path=path, label=f"MLP {path}", moved=True, **_options(draw, n))


def _sequences(draw, rng, n, steps, width, layers):
    """``(x, tokens)``: ``n`` sequences of ``steps`` token ids read by an Embedding of ``width``
    (appended to ``layers``; ``tokens`` True) or of vectors of ``width``."""
    if draw(st.booleans()):
        num = draw(st.integers(2, 5))
        layers.append({"type": "Embedding", "num": num, "dim": width})
        return rng.integers(0, num, size=(n, steps)), True
    return rng.uniform(-2, 2, size=(n, steps, width)), False


def _loss_for(draw, rank):
    """A loss for outputs of ``rank`` (per position: the elementwise losses only)."""
    return draw(st.sampled_from(["mse", "binary_cross_entropy_with_logits"] if rank == 3 else
                                ["mse", "cross_entropy", "categorical_cross_entropy",
                                 "binary_cross_entropy_with_logits"]))


@st.composite
def recurrent_cases(draw, dtype="float64"):
    """A model the compiled recurrent epoch trains (``path="fused"``): token ids through an
    Embedding or features (optionally a per-step Dense first), one or two RNN / LSTM layers
    (the last with or without ``return_sequences``), sometimes nested in a Sequential, and a
    linear Dense; batches of up to a piece and a few rows, so some batches cross a piece."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    piece = kernel_boundaries()["compiled_recurrent_piece"]
    n = draw(st.sampled_from([3, 5, piece - 1, piece + 1, piece + 3]))
    steps = draw(st.integers(1, 3))
    width = draw(st.integers(1, 3))
    layers = []
    x, tokens = _sequences(draw, rng, n, steps, width, layers)
    if not tokens and draw(st.booleans()):
        out = draw(st.integers(1, 3))
        layers.append({"type": "Dense", "in_features": width, "out_features": out,
                       "activation": draw(st.sampled_from(FUSED_SMOOTH))})
        width = out
    n_rec = draw(st.integers(1, 2))
    tail = []
    for k in range(n_rec):
        hidden = draw(st.integers(1, 3))
        seqs = True if k < n_rec - 1 else draw(st.booleans())
        tail.append({"type": draw(st.sampled_from(["RNN", "LSTM"])), "input_size": width,
                     "hidden_size": hidden, "return_sequences": seqs})
        width = hidden
    classes = draw(st.integers(2, 3))
    tail.append({"type": "Dense", "in_features": width, "out_features": classes,
                 "activation": "linear"})
    layers += [{"type": "Sequential", "layers": tail}] if draw(st.booleans()) else tail
    rank = 3 if tail[-2]["return_sequences"] else 2
    out_shape = (n, steps, classes) if rank == 3 else (n, classes)
    loss = _loss_for(draw, rank)
    y = _targets(rng, loss, classes, out_shape)
    return EpochCase({"type": "Sequential", "layers": layers}, x, y, loss, seed, dtype,
                     path="fused", label="compiled recurrent", moved=True,
                     **_options(draw, n))


@st.composite
def attention_cases(draw, dtype="float64"):
    """A model the compiled attention path trains: (an Embedding,) causal or non-causal
    attention, alone or added to a Dense or RNN / LSTM branch (a Parallel ``add``), an RNN or
    LSTM before it, a LayerNorm, RMSNorm or SwiGLU, maybe an RNN or LSTM after it (every state
    or the last), and a Dense head; ``mse`` or ``binary_cross_entropy_with_logits`` on every
    position, any loss on a last state."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n, seq = draw(st.integers(3, 6)), draw(st.integers(1, 4))
    width = draw(st.sampled_from([2, 4]))
    layers = []
    x, _ = _sequences(draw, rng, n, seq, width, layers)
    # where a recurrent layer stands in the model (the compiled program's RNN / LSTM rows)
    recurrent = draw(st.sampled_from(["none", "before", "branch", "after"]))
    kind = draw(st.sampled_from(["RNN", "LSTM"]))
    if recurrent == "before":
        layers.append({"type": kind, "input_size": width, "hidden_size": width,
                       "return_sequences": True})
    attention = {"type": "MultiHeadAttention", "d_model": width,
                 "heads": draw(st.sampled_from([1, 2])), "causal": draw(st.booleans())}
    if recurrent == "branch":
        attention = {"type": "Parallel", "combine": "add", "layers": [
            attention, {"type": kind, "input_size": width, "hidden_size": width,
                        "return_sequences": True}]}
    elif draw(st.booleans()):
        attention = {"type": "Parallel", "combine": "add", "layers": [
            attention, {"type": "Dense", "in_features": width, "out_features": width,
                        "activation": draw(st.sampled_from(SMOOTH))}]}
    layers.append(attention)
    cfg, width, rank = _block(draw, draw(st.sampled_from(["LayerNorm", "RMSNorm", "SwiGLU"])),
                              width, 3)
    layers.append(cfg)
    if recurrent == "after":
        cfg, width, rank = _block(draw, kind, width, rank)
        layers.append(cfg)
    classes = draw(st.integers(2, 3))
    layers.append({"type": "Dense", "in_features": width, "out_features": classes,
                   "activation": "linear"})
    loss = _loss_for(draw, rank)
    y = _targets(rng, loss, classes, (n, seq, classes) if rank == 3 else (n, classes))
    return EpochCase({"type": "Sequential", "layers": layers}, x, y, loss, seed, dtype,
                     path="compiled", label=f"compiled attention (recurrent {recurrent})",
                     moved=True, **_options(draw, n))


# ---------------------------------------------------------------------------------------------
# the boundaries

def _mlp(widths, activation="tanh"):
    layers = [{"type": "Dense", "in_features": a, "out_features": b, "activation": activation}
              for a, b in zip(widths[:-2], widths[1:-1])]
    layers.append({"type": "Dense", "in_features": widths[-2], "out_features": widths[-1],
                   "activation": "linear"})
    return {"type": "Sequential", "layers": layers}


def _recurrent(kind, width, hidden, seqs):
    return {"type": "Sequential", "layers": [
        {"type": kind, "input_size": width, "hidden_size": hidden, "return_sequences": seqs},
        {"type": "Dense", "in_features": hidden, "out_features": 2, "activation": "linear"}]}


def _attention(d, heads, causal):
    return {"type": "Sequential", "layers": [
        {"type": "MultiHeadAttention", "d_model": d, "heads": heads, "causal": causal},
        {"type": "Dense", "in_features": d, "out_features": 2, "activation": "linear"}]}


#: how far from its kink every pre-activation of a kinked case lies
KINK_MARGIN = 0.25


def kinked_cases(dtype):
    """A relu and a leaky_relu Dense (into a linear one) on every CPU path, one whole-batch
    SGD step each, with inputs chosen so that every pre-activation of the kinked layer lies at
    least :data:`KINK_MARGIN` from 0, on both sides of it.

    The random cases train smooth activations only (a rounding may carry a pre-activation
    across a kink, an O(1) change that is no accuracy error). Here none can: the step's
    gradient is taken at the initial weights, which the seed gives every engine alike
    (``reflib.models.from_config``), and the margin is many orders above any rounding of them,
    so a derivative wrong on one side of the kink (relu' = slope for z < 0, say) fails.
    """
    from reflib.models import from_config

    cases = []
    for k, activation in enumerate(KINKED):
        for path in ("generic", "fused", "pieces", "general"):
            seed = 20261129 + 10 * k
            rng = np.random.default_rng(seed)
            width, hidden, classes, n = 3, 4, 2, 6
            config = {"type": "Sequential", "layers": [
                {"type": "Dense", "in_features": width, "out_features": hidden,
                 "activation": activation},
                {"type": "Dense", "in_features": hidden, "out_features": classes,
                 "activation": "linear"}]}
            params = from_config(config, seed=seed).parameters()
            w, b = np.asarray(params["0.weight"]), np.asarray(params["0.bias"])
            rows = []
            while len(rows) < n:
                row = rng.uniform(-2, 2, size=width)
                if np.all(np.abs(row @ w + b) >= KINK_MARGIN):
                    rows.append(row)
            x = np.array(rows)
            pre = x @ w + b
            assert (pre < 0).any() and (pre > 0).any(), "both sides of the kink"
            loss = "mse" if k % 2 == 0 else "cross_entropy"
            cases.append(EpochCase(config, x, _targets(rng, loss, classes, (n, classes)), loss,
                                   seed, dtype, optimizer="SGD", lr=0.05, batch_size=n,
                                   epochs=1, path=path, label=f"{activation} Dense {path}"))
    return cases


def boundary_cases(dtype):
    """Explicit cases on each side of every boundary of ``kernel_boundaries()``.

    float64 cases are small enough for exact (30-digit) references; the float32 ones cross
    the size thresholds (pieces of the fused epoch by parameter count, blocks of 512 rows,
    parallel kernels) and are held against the float64 referee.
    """
    b = kernel_boundaries()
    piece, block = b["recurrent_piece"], b["reduce_block"]
    rng = np.random.default_rng(20261124)
    cases = []

    def seq_data(n, t, w):
        return rng.uniform(-1.5, 1.5, size=(n, t, w))

    if dtype == "float64":
        # recurrent pieces: batches of piece - 1, piece, piece + 1 rows, and two pieces plus a
        # row; the epoch's last batch is partial so a batch ends inside a piece
        # (each kind with a batch of two pieces, so the second piece's backward starts from
        # its own zero carry)
        for kind, n, bs, opt in (("RNN", piece + 1, piece, "Adam"),
                                 ("RNN", 2 * piece + 1, piece + 1, "SGD"),
                                 ("LSTM", 2 * piece + 1, piece + 1, "Momentum"),
                                 ("LSTM", piece - 1, piece - 1, "NAG")):
            x = seq_data(n, 3, 2)
            cases.append(EpochCase(_recurrent(kind, 2, 2, kind == "LSTM"), x,
                                   rng.uniform(-1, 1, (n, 3, 2)) if kind == "LSTM"
                                   else rng.uniform(-1, 1, (n, 2)), "mse", 11, dtype, opt, 0.05,
                                   bs, 1, True, label=f"{kind} batch {bs} of {n} "
                                                      f"(pieces of {piece})"))
        # the float64 pairwise sums: a loss mean over block + 1 terms (an MLP on block + 1
        # samples), in the generic loop and in the fused epoch
        n = block + 1
        x = rng.uniform(-1, 1, (n, 2))
        y = rng.integers(0, 2, (n, 1))
        for path in ("generic", "fused"):
            cases.append(EpochCase(_mlp([2, 2, 2]), x, y, "cross_entropy", 12, dtype, "RMSprop",
                                   0.01, n, 1, False, path=path,
                                   label=f"MLP one batch of {n} (blocks of {block}), {path}"))
        # the fused epoch in pieces: a width-1 layer leaves a piece empty
        x = rng.uniform(-1, 1, (7, 3))
        cases.append(EpochCase(_mlp([3, 1, 4, 2]), x, rng.integers(0, 2, (7, 1)),
                               "cross_entropy", 13, dtype, "Adam", 0.05, 3, 2, True,
                               0.5, "norm", "pieces", label="MLP 3-1-4-2 in pieces, partial "
                                                            "batch, norm clip"))
        # piece plans: one piece, three, a piece of one sample, more pieces than samples, for
        # each schedule (MLP column pieces, recurrent and attention sample pieces); batches
        # of 5 of 7 samples (the last batch partial)
        x2, x3 = rng.uniform(-1, 1, (7, 3)), seq_data(7, 3, 2)
        for plan in (1, 3, 4, 9):
            what = {1: "one piece", 3: "three pieces", 4: "one sample in a piece",
                    9: "more pieces than samples or columns"}[plan]
            cases.append(EpochCase(_mlp([3, 4, 2]), x2, rng.integers(0, 2, (7, 1)),
                                   "cross_entropy", 30 + plan, dtype, "Adam", 0.05, 5, 1, True,
                                   0.5, "norm", "fused", pieces=plan,
                                   label=f"MLP 3-4-2, piece plan {plan} ({what})"))
            cases.append(EpochCase(_recurrent("LSTM", 2, 2, False), x3,
                                   rng.uniform(-1, 1, (7, 2)), "mse", 40 + plan, dtype, "Adam",
                                   0.05, 5, 1, True, 0.5, "value", "fused", pieces=plan,
                                   label=f"compiled LSTM batch 5, piece plan {plan} ({what})"))
            cases.append(EpochCase(_attention_block(2, 2, True), x3,
                                   rng.uniform(-1, 1, (7, 3, 2)), "mse", 50 + plan, dtype,
                                   "Adam", 0.05, 5, 1, True, 0.5, "norm", "compiled",
                                   pieces=plan,
                                   label=f"compiled attention batch 5, piece plan {plan} "
                                         f"({what})"))
        # the compiled recurrent epoch: batches of a piece less one, a piece plus one (the
        # second piece one sequence long) and two pieces plus one, a partial last batch
        cp = b["compiled_recurrent_piece"]
        for kind, n, bs, seqs, opt, clip_mode in (
                ("LSTM", 2 * cp + 1, cp + 1, True, "Adam", "norm"),
                ("RNN", cp + 1, cp, False, "SGD", "value"),
                ("LSTM", cp - 1, cp - 1, False, "Momentum", "value"),
                ("RNN", 2 * cp + 1, 2 * cp + 1, True, "RMSprop", "norm")):
            x = seq_data(n, 3, 2)
            y = (rng.uniform(-1, 1, (n, 3, 2)) if seqs else rng.uniform(-1, 1, (n, 2)))
            cases.append(EpochCase(_recurrent(kind, 2, 2, seqs), x, y, "mse", 15, dtype, opt,
                                   0.05, bs, 1, True, 0.5, clip_mode, "fused",
                                   label=f"compiled {kind} batch {bs} of {n} (PIECE {cp})"))
        # tokens: an Embedding whose rows repeat across the pieces
        x = rng.integers(0, 3, size=(cp + 2, 3))
        cfg = _recurrent("LSTM", 2, 2, False)
        cfg["layers"].insert(0, {"type": "Embedding", "num": 3, "dim": 2})
        cases.append(EpochCase(cfg, x, rng.integers(0, 2, (cp + 2, 1)), "cross_entropy", 16,
                               dtype, "AdamW", 0.05, cp + 1, 1, True, 0.5, "value", "fused",
                               label=f"compiled Embedding + LSTM batch {cp + 1} (PIECE {cp})"))
        # causal and non-causal attention, a sequence over two recurrent-piece lengths
        for causal in (True, False):
            x = seq_data(5, piece + 1, 2)
            cases.append(EpochCase(_attention(2, 2, causal), x,
                                   rng.uniform(-1, 1, (5, piece + 1, 2)), "mse", 14, dtype,
                                   "AdamW", 0.05, 2, 1, True, 0.5, "value",
                                   label=f"attention causal={causal} seq {piece + 1}"))
        # the compiled attention path: batches of rows one below and at the size that cuts
        # them into pieces (sequences of 4, the last batch partial), causal and not
        rows = b["attention_min_piece_rows"]
        for causal, bs in ((True, rows // 4 - 1), (False, rows // 4)):
            n = bs + 2
            cases.append(EpochCase(_attention_block(2, 2, causal), seq_data(n, 4, 2),
                                   rng.uniform(-1, 1, (n, 4, 2)), "mse", 15, dtype, "Adam",
                                   0.05, bs, 1, True, 0.5, "norm", "compiled",
                                   label=f"compiled attention causal={causal}, batch {bs} x 4 "
                                         f"rows (pieces from {rows})"))
        # the compiled program's recurrent rows: batches of sequences of 4 one row below the
        # size that cuts them into pieces (one piece of more than a recurrent sub-piece) and
        # past it (two pieces, each a sub-piece plus one), the last batch partial
        sub = b["compiled_recurrent_piece"]
        for causal, bs, (kind, seqs) in ((True, rows // 4 - 1, ("LSTM", False)),
                                         (False, 2 * sub + 2, ("RNN", True))):
            n = bs + 2
            y = rng.uniform(-1, 1, (n, 4, 2) if seqs else (n, 2))
            cases.append(EpochCase(_mixed(2, causal, kind, seqs), seq_data(n, 4, 2), y, "mse",
                                   17, dtype, "Adam" if causal else "SGD", 0.05, bs, 1, True,
                                   0.5, "norm" if causal else "value", "compiled",
                                   label=f"compiled {kind} + attention, batch {bs} x 4 rows "
                                         f"(pieces from {rows}, sub-pieces of {sub})"))
        # every parameter off its initial value: a LayerNorm and an RMSNorm behind a Dense
        # (their input gradients held, their weights off 1), and the fused epoch's
        # categorical cross-entropy on targets that miss summing to 1 by up to the tolerance
        for norm in ("LayerNorm", "RMSNorm"):
            cfg = {"type": "Sequential", "layers": [
                {"type": "Dense", "in_features": 3, "out_features": 3, "activation": "tanh"},
                {"type": norm, "d": 3, "eps": 1e-5},
                {"type": "Dense", "in_features": 3, "out_features": 2, "activation": "linear"}]}
            cases.append(EpochCase(cfg, rng.uniform(-1, 1, (5, 3)), rng.uniform(-1, 1, (5, 2)),
                                   "mse", 18, dtype, "SGD", 0.05, 3, 1, False,
                                   label=f"Dense + {norm} (weights moved), generic",
                                   moved=True))
        for path in ("generic", "fused"):
            cases.append(EpochCase(_mlp([3, 3, 3]), rng.uniform(-1, 1, (5, 3)),
                                   tolerance_targets(rng, 5, 3), "categorical_cross_entropy",
                                   19, dtype, "SGD", 0.05, 3, 1, False, path=path,
                                   label=f"MLP categorical targets off 1 by the tolerance, "
                                         f"{path}", moved=True))
        # a two-wide LayerNorm behind a Dense: its output is ±1 but for eps, so its input
        # gradient is all cancellation, r h eps / (var + eps) per row (the adjoint radius's
        # row, training_rows.narrow_norm)
        cfg = {"type": "Sequential", "layers": [
            {"type": "Dense", "in_features": 3, "out_features": 2, "activation": "tanh"},
            {"type": "LayerNorm", "d": 2, "eps": 1e-5},
            {"type": "Dense", "in_features": 2, "out_features": 2, "activation": "linear"}]}
        cases.append(EpochCase(cfg, rng.uniform(-1, 1, (5, 3)), rng.uniform(-1, 1, (5, 2)),
                               "mse", 20, dtype, "SGD", 0.05, 3, 1, False,
                               label="Dense + two-wide LayerNorm (weights moved), generic",
                               moved=True))
        return cases

    # float32: sizes past the thresholds, against the float64 referee
    split, pieces = b["split_min_params"], PIECES_PATH_PLAN
    # a two-layer MLP d-h-c with (d + 1) h + (h + 1) c parameters on each side of split
    d, c = 64, 3
    h_cut = -(-(split - c) // (d + 1 + c))           # the smallest h at or past the threshold
    for h in (h_cut - 1, h_cut):
        n_params = (d + 1) * h + (h + 1) * c
        x = rng.uniform(-1, 1, (2 * pieces + 3, d))
        cases.append(EpochCase(_mlp([d, h, c]), x, rng.integers(0, c, (len(x), 1)),
                               "cross_entropy", 21, dtype, "Adam", 0.01, 2 * pieces, 1, True,
                               0.5, "value", "fused", pieces=pieces,
                               label=f"MLP {d}-{h}-{c}: {n_params} parameters "
                                     f"({'>=' if n_params >= split else '<'} {split})"))
    # pairwise blocks in attention's bias gradients (B * T rows) and in the losses' means
    t = 4
    n = -(-(block + 1) // t)
    x = seq_data(n, t, 2)
    cases.append(EpochCase(_attention(2, 1, True), x, rng.uniform(-1, 1, (n, t, 2)), "mse", 22,
                           dtype, "SGD", 0.05, n, 1, False, label=f"attention {n} x {t} rows "
                                                                  f"(blocks of {block})"))
    # recurrent pieces in float32
    x = seq_data(2 * piece + 1, 2, 3)
    cases.append(EpochCase(_recurrent("LSTM", 3, 3, False), x,
                           rng.uniform(-1, 1, (len(x), 2)), "mse", 23, dtype, "Adagrad", 0.05,
                           piece + 1, 1, True, label=f"LSTM batch {piece + 1} of {len(x)}"))
    # the compiled recurrent epoch's update blocks: LSTM(2, h) + Dense(h, 2) with a parameter
    # vector on each side of one block, batches of two pieces (the second partial)
    cp, block = b["compiled_recurrent_piece"], b["compiled_recurrent_block"]

    def lstm_params(h):
        return 4 * h * (2 + h + 1) + (h + 1) * 2
    h = 1
    while lstm_params(h + 1) < block:
        h += 1
    for hidden in (h, h + 1):          # the largest below one block, the smallest past it
        x = seq_data(cp + 3, 2, 2)
        cases.append(EpochCase(_recurrent("LSTM", 2, hidden, False), x,
                               rng.integers(0, 2, (cp + 3, 1)), "cross_entropy", 25, dtype,
                               "Adam", 0.01, cp + 1, 1, True, 0.5, "norm", "fused",
                               label=f"compiled LSTM(2, {hidden}), {lstm_params(hidden)} "
                                     f"weights (update blocks of {block})"))
    # a parameter of parallel_min_size entries (the optimizer kernel runs in chunks) and
    # LayerNorm rows over parallel_min_size entries, in the generic loop
    par = b["parallel_min_size"]
    width = 128
    rows = -(-par // width)
    x = rng.uniform(-1, 1, (rows, width))
    cfg = {"type": "Sequential", "layers": [
        {"type": "Dense", "in_features": width, "out_features": par // width,
         "activation": "tanh"},
        {"type": "LayerNorm", "d": par // width, "eps": 1e-5},
        {"type": "Dense", "in_features": par // width, "out_features": 2,
         "activation": "linear"}]}
    cases.append(EpochCase(cfg, x, rng.uniform(-1, 1, (rows, 2)), "mse", 24, dtype, "Adam",
                           0.01, rows, 1, False, label=f"Dense {width}x{par // width} "
                                                       f"({par} weights), {rows} rows"))
    # the compiled attention path's gradient chunks: a model of width d with parameters on
    # each side of attention_chunk_min_params, in pieces (batches past the piece size)
    chunk = b["attention_chunk_min_params"]
    steps = 4
    bs = -(-b["attention_min_piece_rows"] // steps)
    for d in _attention_widths(chunk):
        cfg = _attention_block(d, 2, True)
        n_params = 4 * d * d + 7 * d + 2
        x = seq_data(bs + 1, steps, d)
        cases.append(EpochCase(cfg, x, rng.uniform(-1, 1, (len(x), steps, 2)), "mse", 25,
                               dtype, "Adam", 0.01, bs, 1, True, 0.5, "value", "compiled",
                               label=f"compiled attention d={d}, {n_params} weights "
                                     f"({'>=' if n_params >= chunk else '<'} {chunk})"))
    # the same chunks with an LSTM in the compiled program: LSTM(2, h) + RMSNorm + Dense(h, 2)
    # on each side of attention_chunk_min_params
    def mixed_params(h):
        return 4 * h * (2 + h + 1) + h + (h + 1) * 2
    h = 1
    while mixed_params(h + 1) < chunk:
        h += 1
    for hidden in (h, h + 1):
        cfg = {"type": "Sequential", "layers": [
            {"type": "LSTM", "input_size": 2, "hidden_size": hidden, "return_sequences": True},
            {"type": "RMSNorm", "d": hidden, "eps": 1e-5},
            {"type": "Dense", "in_features": hidden, "out_features": 2, "activation": "linear"}]}
        x = seq_data(bs + 1, steps, 2)
        cases.append(EpochCase(cfg, x, rng.uniform(-1, 1, (len(x), steps, 2)), "mse", 26,
                               dtype, "Adam", 0.01, bs, 1, True, 0.5, "norm", "compiled",
                               label=f"compiled LSTM(2, {hidden}) + RMSNorm, "
                                     f"{mixed_params(hidden)} weights "
                                     f"({'>=' if mixed_params(hidden) >= chunk else '<'} "
                                     f"{chunk})"))
    return [c.with_(referee="float64") for c in cases]


def _mixed(d, causal, kind, seqs):
    """A residual block whose branches are an LSTM and attention (a Parallel ``add``), then
    an RNN or LSTM (every state or the last) and a Dense head."""
    return {"type": "Sequential", "layers": [
        {"type": "Parallel", "combine": "add", "layers": [
            {"type": "LSTM", "input_size": d, "hidden_size": d, "return_sequences": True},
            {"type": "MultiHeadAttention", "d_model": d, "heads": 1, "causal": causal}]},
        {"type": kind, "input_size": d, "hidden_size": d, "return_sequences": seqs},
        {"type": "Dense", "in_features": d, "out_features": 2, "activation": "linear"}]}


def _attention_block(d, heads, causal):
    """Attention, an RMSNorm and a Dense head: 4 d^2 + 7 d + 2 parameters."""
    return {"type": "Sequential", "layers": [
        {"type": "MultiHeadAttention", "d_model": d, "heads": heads, "causal": causal},
        {"type": "RMSNorm", "d": d, "eps": 1e-5},
        {"type": "Dense", "in_features": d, "out_features": 2, "activation": "linear"}]}


def _attention_widths(chunk):
    """The largest even width whose ``_attention_block`` stays below ``chunk`` parameters,
    and the next even width (at or past it)."""
    d = 2
    while 4 * (d + 2) ** 2 + 7 * (d + 2) + 2 < chunk:
        d += 2
    return d, d + 2


# ---------------------------------------------------------------------------------------------
# mixed precision: Dense MLPs trained in bfloat16 / float16 over float32 master weights

def _row_peak(config, seed, x, y, loss):
    """The largest unscaled backward peak over single-row batches at the initial parameters:
    no batch's is larger (a mean over rows is at most its largest row)."""
    import fastlib
    from reports.conformance.mixed_training import scaled_peak

    params = {k: np.asarray(v, np.float64) for k, v in fastlib.layers.from_config(
        config, dtype=np.float32, seed=seed).parameters().items()}
    return max(scaled_peak(config, params, x[i:i + 1], y[i:i + 1], loss)
               for i in range(len(x)))


@st.composite
def mixed_cases(draw, fmt, paths=("generic", "fused", "pieces", "general")):
    """A Dense MLP trained in mixed ``fmt`` for two epochs, on one of ``paths``: the per-batch
    path, the compiled MLP epoch (whole, or cut into pieces), the interpreter (the general
    schedule) or the device (``"cuda"``).
    float16 runs under a dynamic loss scale 8
    to 16 times below the overflow of every batch's backward at the start (so no step sits
    near it; ``loss_scale_cases`` crosses it on purpose)."""
    from reports.conformance.mixed_training import MIXED_ACTIVATIONS, MIXED_LOSSES

    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    width, classes, layers = dense_chain(draw, MIXED_ACTIVATIONS, 2)
    n = draw(st.integers(3, 9))
    loss = draw(st.sampled_from(MIXED_LOSSES))
    x = rng.uniform(-2, 2, size=(n, width))
    y = _targets(rng, loss, classes, (n, classes))
    config = {"type": "Sequential", "layers": layers}
    scale = None
    if fmt == "float16":
        peak = _row_peak(config, seed, x.astype(np.float32), y, loss)
        threshold = optable.formats.FORMATS["float16"].overflow
        scale = {"init_scale": 2.0 ** int(np.floor(np.log2(threshold / (8.0 * peak))))}
    path = draw(st.sampled_from(list(paths)))
    return EpochCase(config, x, y, loss, seed, "float32", path=path,
                     label=f"MLP mixed {fmt} {path}", mixed=fmt, loss_scale=scale,
                     **_options(draw, n))


def loss_scale_cases(paths=("generic", "fused", "general")):
    """float16 runs whose loss scale starts 2**3.5 times above the overflow of the backward:
    four skipped steps (the scale halved each time), then a growth every two clean steps that
    overflows again, so skips, backoffs and growths alternate, each step a factor sqrt(2)
    clear of the threshold; one batch per epoch, so a skipped step repeats the same batch.
    Each runs on every one of ``paths`` (default: the per-batch path, the compiled MLP epoch
    and the interpreter; ``("cuda",)``: the device)."""
    import fastlib
    from reports.conformance.mixed_training import scaled_peak

    rng = np.random.default_rng(20261127)
    threshold = optable.formats.FORMATS["float16"].overflow
    cases = []
    for optimizer, lr in (("SGD", 0.01), ("Adam", 0.001)):
        config = _mlp([3, 4, 2])
        x = rng.uniform(-2, 2, size=(6, 3))
        y = rng.integers(0, 2, size=(6, 1))
        params = {k: np.asarray(v, np.float64) for k, v in fastlib.layers.from_config(
            config, dtype=np.float32, seed=7).parameters().items()}
        # the inputs as float16 holds them: what the run's first backward reads
        x16 = x.astype(np.float32).astype(np.float16).astype(np.float64)
        peak = scaled_peak(config, params, x16, y, "cross_entropy")
        scale = {"init_scale": float(threshold / peak * 2.0 ** 3.5), "growth_interval": 2}
        for path in paths:
            cases.append(EpochCase(config, x, y, "cross_entropy", 7, "float32", optimizer, lr,
                                   batch_size=6, epochs=10, shuffle=False, path=path,
                                   label=f"loss scale float16 {optimizer} {path}",
                                   mixed="float16", loss_scale=scale))
    return cases
