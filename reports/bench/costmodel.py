"""A cost model of one training step of each benchmark model, cut into P pieces.

Per step: GEMM FLOPs (split over the pieces, at a rate that falls when a piece has few rows),
activation traffic (split), weight traffic (16 W bytes per core: every piece reads all the
weights; not split), Adam's traffic (split) and 3 barriers, so
``t(P) = F / (P R(rows)) + 4 B A / (P M) + 16 W / M + 28 W / (P M) + 3 beta``.
The long story and the predictions beside the measurements: docs/performance.md, section
"How the step scales with threads".
"""
from __future__ import annotations

from typing import NamedTuple

#: Assumed machine constants (one core): the sgemm rate at large shapes, the rows at which a
#: GEMM reaches half of it, the cache bandwidth, one barrier's cost. Replace them with a
#: machine's own (``verigrad bench ops`` times GEMMs) to predict that machine.
R_MAX, ROWS_HALF, BANDWIDTH, BARRIER_S = 100e9, 8.0, 100e9, 5e-6
BARRIERS_PER_STEP = 3

L, D, HEADS, HIDDEN = 64, 64, 4, 128  # the sequence models' positions, width, heads, SwiGLU


class StepCost(NamedTuple):
    """One model's step at batch 1: GEMM FLOPs (split by the GEMMs' row counts), stored
    activations (floats) per sample, parameters."""

    flops: dict        # {rows per sample of the GEMM: FLOPs per sample}
    activations: int   # floats stored and re-read per sample
    parameters: int


def _dense(i, o):
    return i * o + o


def mlp():
    """784-128-10: forward x@W1, h@W2; weight gradients; h's input gradient (not the data's)."""
    f = 2 * (784 * 128 + 128 * 10) * 2 + 2 * 128 * 10
    return StepCost({1: f}, 784 + 2 * 128 + 2 * 10, _dense(784, 128) + _dense(128, 10))


def lstm():
    """LSTM(32 -> 128) over 64 steps + Dense(128 -> 10) on the last state.

    Input projections (x@W_ih forward, W_ih's gradient) run on all 64 positions at once (64
    rows per sample); the recurrence (h@W_hh forward, dh@W_hh^T and W_hh's gradient) one time
    step at a time (1 row per sample per step).
    """
    proj = 2 * 32 * 512 * 64 * 2
    recur = 2 * 128 * 512 * 64 * 3
    dense = 2 * 128 * 10 * 3
    params = 32 * 512 + 128 * 512 + 512 + _dense(128, 10)
    return StepCost({64: proj, 1: recur + dense}, 64 * (32 + 512 + 2 * 128), params)


def _attention_forward():
    """Causal MHA(64, 4): QKV and output projections, scores and weighted sums per head."""
    return 2 * L * D * 3 * D + 2 * L * D * D, 2 * 2 * L * L * (D // HEADS) * HEADS


def _swiglu_forward():
    return 2 * L * D * 2 * HIDDEN + 2 * L * HIDDEN * D


def attention():
    """MHA(64, 4) + LayerNorm + SwiGLU(64, 128, 64) on 64 positions; the data needs no input
    gradient, so the QKV projection's backward is one GEMM, not two."""
    proj, heads = _attention_forward()
    fwd = proj + heads + _swiglu_forward()
    bwd = 2 * fwd - 2 * L * D * 3 * D
    params = 4 * _dense(D, D) + 2 * D + 3 * D * HIDDEN  # SwiGLU has no biases
    acts = L * (3 * D + HEADS * L + D + 2 * D + 3 * HIDDEN + D)
    return StepCost({L: fwd + bwd}, acts, params)


def transformer():
    """Embedding(29, 64) + two residual blocks (Dense shortcut + LayerNorm + MHA; Dense
    shortcut + LayerNorm + SwiGLU) + LayerNorm + Dense(64, 29). The embedding's gradient is a
    scatter, not a GEMM; every GEMM after it needs its input gradient."""
    proj, heads = _attention_forward()
    fwd = 2 * (2 * L * D * D) + proj + heads + _swiglu_forward() + 2 * L * D * 29
    params = (29 * D + 2 * _dense(D, D) + 3 * 2 * D + 4 * _dense(D, D)
              + 3 * D * HIDDEN + _dense(D, 29))
    acts = L * (2 * D + 3 * D + HEADS * L + D + 2 * D + 3 * HIDDEN + D + 2 * D + 29)
    return StepCost({L: 3 * fwd}, acts, params)


MODELS = {"mlp": mlp, "lstm": lstm, "attention": attention, "transformer": transformer}


def gemm_rate(rows):
    """The assumed one-core sgemm rate for a GEMM with ``rows`` rows: R_MAX rows/(rows+half)."""
    return R_MAX * rows / (rows + ROWS_HALF)


def step_seconds(name, batch, pieces):
    """The predicted seconds of one step of model ``name`` at ``batch`` on ``pieces`` cores.

    Pieces beyond the batch's rows idle (a piece of no rows does nothing), so the pieces that
    work are ``min(pieces, batch)``.
    """
    cost = MODELS[name]()
    p = max(1, min(pieces, batch))
    gemm = sum(f * batch / (p * gemm_rate(rows * batch / p)) for rows, f in cost.flops.items())
    acts = 4 * batch * cost.activations / (p * BANDWIDTH)
    weights = 16 * cost.parameters / BANDWIDTH + 28 * cost.parameters / (p * BANDWIDTH)
    return gemm + acts + weights + BARRIERS_PER_STEP * BARRIER_S


def flops_per_sample(name):
    """GEMM FLOPs of one sample's forward and backward."""
    return sum(MODELS[name]().flops.values())


def prediction(name, batch, threads=(1, 2, 4, 8, 16), samples=None):
    """``{threads: (seconds per epoch, speedup over one thread)}`` with P = threads pieces."""
    samples = samples or (60000 if name == "mlp" else 1024)
    steps = -(-samples // batch)
    one = step_seconds(name, batch, 1) * steps
    return {t: (step_seconds(name, batch, t) * steps,
                one / (step_seconds(name, batch, t) * steps)) for t in threads}
