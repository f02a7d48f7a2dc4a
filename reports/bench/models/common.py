"""The engine loops every benchmark model shares: fastlib.train, PyTorch eager, JAX jit + scan.

A model module supplies its definition once (a fastlib model whose initial parameters every
engine copies, its loss, and the same forward pass written for PyTorch and for JAX); the
functions here turn that into ``bench(x, y, bs, max_steps, seed) -> Run`` for each engine, so
every engine trains the same model from the same weights with the same loop: shuffle, forward,
loss, backward, Adam (lr 1e-3, betas 0.9 / 0.999, eps 1e-8) step, the last incomplete batch
included. ``Run.loss`` is the sample-weighted mean of the batch losses of the timed steps, each
taken before its update (what ``fastlib.train`` reports as the epoch's loss), so the engines'
losses can be compared after the timing.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

LR = 1e-3
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


class Run(NamedTuple):
    """One timed run: seconds for ``steps`` steps, and the mean batch loss over them."""

    seconds: float
    steps: int
    loss: float


def steps_for(n, bs, max_steps):
    """(steps measured, steps of the full epoch) for ``n`` samples at batch ``bs``."""
    steps = -(-n // bs)
    return min(steps, max_steps), steps


def measured_samples(n, bs, max_steps):
    """(steps measured, samples they cover)."""
    used, _ = steps_for(n, bs, max_steps)
    return used, min(n, used * bs)


def initial_parameters(build, seed):
    """The fastlib model's initial parameters as float32 NumPy copies, keyed by dotted name."""
    return {k: np.array(v, dtype=np.float32) for k, v in build(seed).parameters().items()}


# ---------------------------------------------------------------------------------------------
# fastlib

def bench_fastlib(build, loss, x, y, bs, max_steps, seed=0):
    """Time ``fastlib.train`` for one epoch of the first ``max_steps`` batches.

    The warm-up (compiling, or loading the cached kernels) trains a throwaway copy of the model
    on two batches, outside the timing, so the timed model starts from the seed's weights like
    every other engine's.
    """
    import fastlib

    used, n = measured_samples(len(x), bs, max_steps)
    fastlib.train(build(seed), x[:2 * bs], y[:2 * bs], 1, bs, LR, loss, optimizer="Adam",
                  verbose=False)
    result = fastlib.train(build(seed), x[:n], y[:n], 1, bs, LR, loss, optimizer="Adam",
                           verbose=False, seed=seed)
    return Run(result.epoch_times[0], used, float(result.loss_history[-1]))


# ---------------------------------------------------------------------------------------------
# PyTorch eager

def class_indices(y):
    """Labels ``(N,)`` or ``(N, 1)`` as the contiguous int64 class indices PyTorch takes."""
    return np.ascontiguousarray(y.reshape(-1).astype(np.int64))


def torch_loss(name):
    """``loss(out, yb)``: ``torch.nn.functional.<name>`` (torch imported when first called)."""
    def loss(out, yb):
        import torch

        return getattr(torch.nn.functional, name)(out, yb)
    return loss


def bench_torch(setup, loss_fn, x, y, bs, max_steps, seed=0, device="cpu"):
    """Time a PyTorch eager epoch: ``setup() -> (parameters, forward)``, ``loss_fn(out, yb)``.

    ``torch.optim.Adam`` (its default for-each implementation) updates the parameters; the
    data is on the device before the timing starts, the shuffle inside it.
    """
    import torch

    used, n = measured_samples(len(x), bs, max_steps)
    torch.manual_seed(seed)
    dev = torch.device(device)
    xt = torch.from_numpy(np.ascontiguousarray(x[:n])).to(dev)
    yt = torch.from_numpy(np.ascontiguousarray(y[:n])).to(dev)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # warm-up on a throwaway copy: the first steps pay for lazy initialisation (kernels
    # chosen, autograd and optimizer state set up), which the timed epoch must not
    warm = torch.arange(min(n, 2 * bs), device=dev)
    _torch_epoch(setup, loss_fn, xt, yt, warm, bs, dev)
    sync()
    t0 = time.perf_counter()
    # the same order as fastlib's and JAX's (numpy's Generator), so the losses compare
    order = torch.from_numpy(np.random.default_rng(seed).permutation(n)).to(dev)
    total = _torch_epoch(setup, loss_fn, xt, yt, order, bs, dev)
    sync()
    seconds = time.perf_counter() - t0
    return Run(seconds, used, float(total) / len(order))


def _torch_epoch(setup, loss_fn, xt, yt, order, bs, dev):
    """One pass over ``order`` from fresh parameters; the summed (loss x batch) as a tensor."""
    import torch

    params, forward = setup(dev)
    opt = torch.optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for s in range(0, len(order), bs):
        idx = order[s:s + bs]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(forward(xt[idx]), yt[idx])
        loss.backward()
        opt.step()
        total += loss.detach() * len(idx)
    return total


def torch_parameters(params, dev):
    """The NumPy parameters as leaf tensors that require gradients, same names."""
    import torch

    return {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in params.items()}


# ---------------------------------------------------------------------------------------------
# JAX: the whole epoch is one jitted function, lax.scan over the batches

_JAX_COMPILED = {}


def jax_missing():
    """None when JAX imports, else the line that says how to install it."""
    try:
        import jax  # noqa: F401
    except ImportError:
        return "not installed: pip install 'jax[cpu]' (or pip install 'verigrad[jax]')"
    return None


def _jax_epoch(forward, loss_fn):
    """``epoch(params, m, v, t, xs, ys) -> (params, m, v, t, losses)`` over stacked batches."""
    import jax
    import jax.numpy as jnp

    def batch_loss(params, xb, yb):
        return loss_fn(forward(params, xb), yb)

    grad = jax.value_and_grad(batch_loss)

    def step(carry, batch):
        params, m, v, t = carry
        xb, yb = batch
        loss, g = grad(params, xb, yb)
        t = t + 1
        c1 = 1.0 / (1.0 - BETA1 ** t)
        c2 = 1.0 / (1.0 - BETA2 ** t)
        m = jax.tree.map(lambda m_, g_: BETA1 * m_ + (1 - BETA1) * g_, m, g)
        v = jax.tree.map(lambda v_, g_: BETA2 * v_ + (1 - BETA2) * g_ * g_, v, g)
        params = jax.tree.map(
            lambda p, m_, v_: p - LR * (m_ * c1) / (jnp.sqrt(v_ * c2) + EPS), params, m, v)
        return (params, m, v, t), loss

    def epoch(params, m, v, t, xs, ys):
        (params, m, v, t), losses = jax.lax.scan(step, (params, m, v, t), (xs, ys))
        return params, m, v, t, losses

    return epoch


def bench_jax(key, forward, loss_fn, params_np, x, y, bs, max_steps, seed=0):
    """Time a JAX epoch: ``jax.jit`` of ``lax.scan`` over the full batches, then one jitted step
    for the last incomplete batch. Both are compiled ahead of time (``lower().compile()``, kept
    per model and shape) outside the timing; the shuffle and the gather of the batches are
    inside it, as in the other engines."""
    import jax
    import jax.numpy as jnp

    used, n = measured_samples(len(x), bs, max_steps)
    full, rest = divmod(n, bs)
    params = {k: jnp.asarray(v) for k, v in params_np.items()}
    m = {k: jnp.zeros_like(p) for k, p in params.items()}
    v = {k: jnp.zeros_like(p) for k, p in params.items()}
    t = jnp.zeros((), jnp.float32)
    xd, yd = jnp.asarray(x[:n]), jnp.asarray(y[:n])

    def gathered(xd, yd, idx, steps):
        xs = xd[idx].reshape((steps, bs) + xd.shape[1:])
        ys = yd[idx].reshape((steps, bs) + yd.shape[1:])
        return xs, ys

    epoch = _jax_epoch(forward, loss_fn)

    def run_full(params, m, v, t, xd, yd, idx):
        return epoch(params, m, v, t, *gathered(xd, yd, idx, full))

    def run_rest(params, m, v, t, xd, yd, idx):
        xs, ys = xd[idx][None], yd[idx][None]
        return epoch(params, m, v, t, xs, ys)

    def compiled(name, fn, idx_len):
        k = (key, name, n, bs, idx_len, tuple(x.shape[1:]), str(x.dtype))
        if k not in _JAX_COMPILED:
            idx = jnp.zeros(idx_len, jnp.int32)
            _JAX_COMPILED[k] = jax.jit(fn).lower(params, m, v, t, xd, yd, idx).compile()
        return _JAX_COMPILED[k]

    f_full = compiled("full", run_full, full * bs) if full else None
    f_rest = compiled("rest", run_rest, rest) if rest else None
    jax.block_until_ready((params, xd, yd))
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    order = jnp.asarray(rng.permutation(n).astype(np.int32))
    losses = []
    if f_full is not None:
        params, m, v, t, ls = f_full(params, m, v, t, xd, yd, order[:full * bs])
        losses.append(ls * bs)
    if f_rest is not None:
        params, m, v, t, ls = f_rest(params, m, v, t, xd, yd, order[full * bs:])
        losses.append(ls * rest)
    jax.block_until_ready((params, losses))
    seconds = time.perf_counter() - t0
    loss = float(sum(float(jnp.sum(ls)) for ls in losses)) / n
    return Run(seconds, used, loss)
