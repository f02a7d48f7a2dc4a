"""The suite's power: plausible bugs, each applied alone to a copy of fastlib, must be caught.

``verigrad conform --mutants`` (or ``tests/conformance/test_conform_mutants.py -m slow``) runs
every mutant of ``MUTANTS`` through ``mutant_runner`` with the ``dev`` profile on the fastlib
engine and reports which are caught, by which check, after how many examples and how fast. A
survivor is a hole in the suite. Each mutant names the exact source text it replaces; that text
must occur exactly once in the current fastlib (``check_targets``, run by the fast tests), so a
refactor of fastlib cannot silently turn a mutant into a no-op. ``first`` only orders the run
(the checks most likely to fail go first); every check stays in.

The long story: docs/reports-conformance.md, section ``reports/conformance/mutants.py``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from reports.conformance.mutant_runner import (MutantError, check_targets, run_control,
                                               run_mutant)

__all__ = ["Mutant", "HookMutant", "MUTANTS", "MUTANT_MODULES", "HOOK_MODULES", "all_mutants",
           "hook_mutants", "run_all", "check_targets", "MutantError"]


@dataclass(frozen=True)
class Mutant:
    """One plausible bug: replace ``old`` by ``new`` in ``fastlib/<path>``."""

    key: str
    what: str
    path: str
    old: str
    new: str
    first: tuple = ()


@dataclass(frozen=True)
class HookMutant:
    """One plausible bug planted by a context manager: ``<module>.MUTANTS[name].apply()``.

    The module's ``MUTANTS`` maps a name to an object with ``name``, ``description`` and
    ``apply`` (a ``TrainingMutant``); the key of the mutant is that name.
    """

    key: str
    what: str
    module: str
    first: tuple = ()


MUTANTS = (
    # -- kink conventions ----------------------------------------------------------------------
    Mutant("relu-kink", "relu'(0) = 1 (x >= 0) instead of the registry's 0", "kernels/scalar.py",
           "return like(x, 1.0) if x > 0 else like(x, 0.0)",
           "return like(x, 1.0) if x >= 0 else like(x, 0.0)", ("relu",)),
    Mutant("leaky-kink", "leaky_relu'(0) = 1 instead of the slope", "kernels/scalar.py",
           "return like(x, 1.0) if x > 0 else like(x, slope)",
           "return like(x, 1.0) if x >= 0 else like(x, slope)", ("leaky_relu",)),
    Mutant("maximum-tie", "a tie in maximum sends the gradient to b", "kernels/binary.py",
           "return x >= y or x != x", "return x > y or x != x", ("maximum",)),
    # -- sign flips and missing terms in VJPs ----------------------------------------------------
    Mutant("tanh-sign", "sign flip in tanh's derivative", "kernels/scalar.py",
           "return like(x, 4.0) * e / (d * d)", "return -like(x, 4.0) * e / (d * d)",
           ("tanh",)),
    Mutant("silu-term", "silu' = sigmoid: the x·sigmoid(-x) term dropped", "kernels/scalar.py",
           "return s * (like(x, 1.0) + x * sm) if s != 0 else s",
           "return s * like(x, 1.0) if s != 0 else s", ("silu",)),
    Mutant("gelu-term", "gelu' = Phi: the x·phi(x) term dropped", "kernels/scalar.py",
           "return cdf + x * pdf if pdf != 0 else cdf", "return cdf if pdf != 0 else cdf",
           ("gelu",)),
    Mutant("sigmoid-square", "sigmoid' = e / (1 + e) (one factor of the square lost)",
           "kernels/scalar.py", "    d = like(x, 1.0) + e\n    return e / (d * d)",
           "    d = like(x, 1.0) + e\n    return e / d", ("sigmoid",)),
    Mutant("layer-norm-term", "layer_norm VJP without the y·mean(g·y) term", "kernels/norm.py",
           "out[row, j] = r * (np.float64(gr[j]) - gm - y[j] * gy)",
           "out[row, j] = r * (np.float64(gr[j]) - gm)", ("layer_norm",)),
    Mutant("log-softmax-shift", "log_softmax VJP uses exp(x - max), the normaliser dropped",
           "kernels/norm.py", "o[j] = _lsm_grad(v[j], m, ls, gr[j], gsum)",
           "o[j] = _lsm_grad(v[j], m, 0.0, gr[j], gsum)", ("log_softmax",)),
    Mutant("bce-logits-sign", "sign flip of the target term in bce_with_logits' VJP",
           "kernels/loss.py", "gz[i] = ((1.0 - tv) * sig_pos - tv * sig_neg) * gscale",
           "gz[i] = ((1.0 - tv) * sig_pos + tv * sig_neg) * gscale",
           ("binary_cross_entropy_with_logits",)),
    # -- shapes, axes, broadcasting, slicing -------------------------------------------------------
    Mutant("broadcast-not-summed", "a broadcast gradient not summed back (first copy taken)",
           "kernels/reduce.py",
           "return _sum64(np.ascontiguousarray(g), axes).astype(g.dtype).reshape(shape)",
           "return np.ascontiguousarray(g[(0,) * lead]).reshape(-1)[:int(np.prod(shape))]"
           ".reshape(shape)", ("add", "mul", "sub")),
    Mutant("softmax-axis", "softmax over the wrong axis (axis + 1)", "kernels/norm.py",
           "    ax = axis % x.ndim\n    if ax == x.ndim - 1:",
           "    ax = (axis + 1) % x.ndim\n    if ax == x.ndim - 1:", ("softmax",)),
    Mutant("concat-off-by-one", "concat's VJP for b starts one row early (off by one)",
           "kernels/structure.py",
           "_copy_box(grad, a.shape[axis] * gs[axis], gs, gb, 0, _c_strides(b.shape), b.shape)",
           "_copy_box(grad, (a.shape[axis] - 1) * gs[axis], gs, gb, 0, _c_strides(b.shape), "
           "b.shape)", ("concat",)),
    Mutant("transpose-perm", "transpose's VJP applies the permutation, not its inverse",
           "kernels/structure.py",
           "return _permuted_copy(grad, tuple(int(i) for i in np.argsort(perm)))",
           "return _permuted_copy(grad, tuple(perm))", ("transpose",)),
    Mutant("matmul-shared-b", "a shared b's gradient taken from the first batch element only",
           "kernels/linalg.py", "_gemm(a2.T, g2, gb)", "_gemm(a2[:m].T, g2[:m], gb)",
           ("matmul",)),
    Mutant("cross-entropy-mean", "cross_entropy averaged over N·C entries instead of N rows",
           "kernels/loss.py",
           '"""mean over rows of -log_softmax(logits)[n, target[n]]; grads (grad_logits, None)."""'
           "\n    n = logits.shape[0]",
           '"""mean over rows of -log_softmax(logits)[n, target[n]]; grads (grad_logits, None)."""'
           "\n    n = logits.size", ("cross_entropy",)),
    # -- accuracy ---------------------------------------------------------------------------------
    Mutant("f32-accumulation", "float32 accumulation over a long strided reduction (one "
           "running sum in the input's dtype)", "kernels/reduce.py",
           "    if kind == \"middle\":\n        return _sum_middle(arr, serial=serial)"
           ".reshape(kept)\n",
           "    if kind == \"middle\":\n        return np.cumsum(arr, axis=1, dtype=arr.dtype)"
           "[:, -1].astype(np.float64).reshape(kept)\n", ("sum", "mean")),
    Mutant("broadcast-vjp-f32-terms", "float32 mul/div VJP terms rounded before they are summed "
           "back over broadcast axes (the promised single rounding broken)", "kernels/binary.py",
           "work = np.float64 if reduced else a.dtype", "work = a.dtype", ("mul", "div")),
    Mutant("pairwise-block-short", "a pairwise sum's blocks stop one entry short of the end "
           "(sums longer than one block lose their last entry)", "kernels/reduce.py",
           "s = _block_sum(v, start, min(start + _BLOCK, hi))",
           "s = _block_sum(v, start, min(start + _BLOCK, hi - 1))", ("sum", "mean")),
    Mutant("gelu-tanh-coefficient", "gelu_tanh's cubic coefficient 0.044725 (wrong in the 4th "
           "digit)", "kernels/scalar.py", "_GELU_TANH_A = 0.044715", "_GELU_TANH_A = 0.044725",
           ("gelu_tanh",)),
    Mutant("sigmoid-vjp-float32", "float32 sigmoid VJP evaluated in float32 (a few roundings, "
           "not the promised one)", "kernels/scalar.py",
           "    y = np.float32(np.float64(g) * e / (d * d))\n    return y if x == x else x",
           "    y = np.float32(g) * np.float32(e) / (np.float32(d) * np.float32(d))\n"
           "    return y if x == x else x", ("sigmoid",)),
    Mutant("bce-log-not-log1p", "binary_cross_entropy's (1 - t) term as log(1 - p), not "
           "log1p(-p) (a loss of tiny terms comes out 0)", "kernels/loss.py",
           "        lq[i] = flog1p(-p[i])", "        lq[i] = math.log(1.0 - p[i])",
           ("binary_cross_entropy",)),
    Mutant("softmax-no-shift", "softmax without the max shift (exp overflows at logits 1e4)",
           "kernels/norm.py",
           "        m = _row_max(v)\n        for j in range(d):\n"
           "            o[j] = fexp(v[j] - m)\n"
           "        s = like(v[0], _pairwise_sum(o, 0, d))\n        for j in range(d):\n"
           "            o[j] = o[j] / s\n\n\n",
           "        m = _row_max(v)\n        for j in range(d):\n            o[j] = fexp(v[j])\n"
           "        s = like(v[0], _pairwise_sum(o, 0, d))\n        for j in range(d):\n"
           "            o[j] = o[j] / s\n\n\n", ("softmax",)),
    Mutant("rms-norm-eps-outside", "rms_norm with eps outside the square root", "kernels/norm.py",
           "        r = 1.0 / math.sqrt(_pairwise_sum(sq, 0, d) / d + eps)\n",
           "        r = 1.0 / (math.sqrt(_pairwise_sum(sq, 0, d) / d) + eps)\n", ("rms_norm",)),
    # -- accuracy: answers right in norm, wrong in one small entry, or rounded in the wrong type --
    Mutant("sigmoid-cancel", "sigmoid(x) as 1 - sigmoid(-x) for x < 0 (cancels: sigmoid(-80) "
           "= 0)", "kernels/scalar.py",
           '    """sigmoid(x) = 1 / (1 + exp(-x)), from exp(-|x|) so that it never overflows."""\n'
           "    return _sigmoid_pair(x)[0]\n",
           '    """sigmoid(x) = 1 / (1 + exp(-x)), from exp(-|x|) so that it never overflows."""\n'
           "    return _sigmoid_pair(x)[0] if x >= 0 else like(x, 1.0) - _sigmoid_pair(-x)[0]\n",
           ("sigmoid",)),
    Mutant("softplus-no-log1p", "softplus as max(x, 0) + log(1 + exp(-|x|)), log instead of "
           "log1p (0 for x < -37 in float64)", "kernels/scalar.py",
           "    return pos + log1p(exp(-abs(x)))\n",
           "    return pos + log(like(x, 1.0) + exp(-abs(x)))\n", ("softplus",)),
    Mutant("tanh-flush-tiny", "tanh flushes |x| < 1e-100 to 0 (a tiny result lost)",
           "kernels/scalar.py", '    """tanh(x)."""\n    return tanh(x)\n',
           '    """tanh(x)."""\n    return like(x, 0.0) if abs(x) < 1e-100 else tanh(x)\n',
           ("tanh",)),
    Mutant("large-vjp-entry", "a unary VJP of >= PARALLEL_MIN_SIZE entries has its smallest "
           "nonzero entry 1e-3 (relative) off", "kernels/elementwise.py",
           "    return _launch(name, \"unary_vjp\", \"vjp\", x, grad, "
           "negative_slope=negative_slope)\n",
           "    out = _launch(name, \"unary_vjp\", \"vjp\", x, grad, "
           "negative_slope=negative_slope)\n"
           "    o = out.reshape(-1)\n"
           "    nz = np.flatnonzero(o) if o.size >= config.PARALLEL_MIN_SIZE else o[:0]\n"
           "    if nz.size:\n"
           "        k = nz[np.argmin(np.abs(o[nz]))]\n"
           "        o[k] = o[k] * o.dtype.type(1.001)\n"
           "    return out\n", ("exp", "tanh", "sigmoid")),
    Mutant("f32-leak-elementwise", "float64 tanh VJP evaluates tanh' at x rounded to float32 "
           "(float32 arithmetic leaks into a float64 kernel)", "kernels/scalar.py",
           "lambda x, g: g * tanh_df(x)))", "lambda x, g: g * tanh_df(np.float32(x))))",
           ("tanh",)),
    Mutant("f32-leak-fused", "the float64 compiled epochs' loss rounds the cross-entropy "
           "gradient's softmax to float32", "kernels/batch_loss.py",
           "                    dz[i, j] = math.exp(z[i, j] - lse) * inv_n\n",
           "                    dz[i, j] = np.float32(math.exp(z[i, j] - lse)) * inv_n\n",
           ("train",)),
    Mutant("softmax-lse-f32", "softmax as exp(x - lse) with lse rounded to float32 (float64 "
           "softmax carries |lse| u32 into every exponent)", "kernels/norm.py",
           "        m = _row_max(v)\n        for j in range(d):\n"
           "            o[j] = fexp(v[j] - m)\n"
           "        s = like(v[0], _pairwise_sum(o, 0, d))\n        for j in range(d):\n"
           "            o[j] = o[j] / s\n\n\n",
           "        m = _row_max(v)\n"
           "        lse = like(v[0], np.float32(np.float64(m) + math.log(_row_sumexp(v, m))))\n"
           "        for j in range(d):\n"
           "            o[j] = fexp(v[j] - lse)\n\n\n", ("softmax",)),
    Mutant("maximum-tie-doubled", "a tie in maximum sends the whole gradient to both arguments "
           "(outside the subdifferential: the gradient doubled)", "kernels/binary.py",
           "    return (gv, 0.0) if win else (0.0, gv)\n",
           "    return (gv, gv) if x == y else ((gv, 0.0) if win else (0.0, gv))\n",
           ("maximum",)),
    # -- second order: the jvp2 / hvp rows ----------------------------------------------------
    Mutant("mul-hvp-cross-term", "mul's HVP without its cross term d²(ab)/da db = 1 (each "
           "input's H t misses the other's tangent)", "second_order.py",
           "        return b, a, zero, one, zero", "        return b, a, zero, zero, zero",
           ("mul",)),
    Mutant("softmax-hvp-sign", "softmax's second derivative with the sign of s·Σ(g·ṡ) flipped",
           "second_order.py",
           "                - s * np.sum(g * ds, axis=p[\"axis\"], keepdims=True)]",
           "                + s * np.sum(g * ds, axis=p[\"axis\"], keepdims=True)]",
           ("softmax",)),
    Mutant("norm-sigma-f32", "layer_norm's and rms_norm's σ rounded to float32 in the float64 "
           "JVP and HVP (a float32 intermediate)", "second_order.py",
           "    sigma = np.sqrt((c * c).mean(axis=-1, keepdims=True) + x.dtype.type(eps))\n",
           "    sigma = np.sqrt((c * c).mean(axis=-1, keepdims=True) + x.dtype.type(eps))"
           ".astype(np.float32).astype(x.dtype)\n", ("layer_norm",)),
    # -- optimizers -------------------------------------------------------------------------------
    Mutant("adam-bias-correction", "Adam without the bias correction of m",
           "kernels/optim_rules.py",
           "return (m * inv_bias_beta1) / (sqrt(v * inv_bias_beta2) + eps), m, v",
           "return m / (sqrt(v * inv_bias_beta2) + eps), m, v", ("Adam",)),
    Mutant("rmsprop-eps-outside", "RMSprop with eps outside the square root",
           "kernels/optim_rules.py",
           "E = gamma * E + one_minus_gamma * (g * g)\n    return w - lr / sqrt(E + eps) * g, E",
           "E = gamma * E + one_minus_gamma * (g * g)\n"
           "    return w - lr / (sqrt(E) + eps) * g, E", ("RMSprop",)),
    Mutant("adagrad-eps-outside", "Adagrad with eps outside the square root",
           "kernels/optim_rules.py", "G = G + g * g\n    return w - lr / sqrt(G + eps) * g, G",
           "G = G + g * g\n    return w - lr / (sqrt(G) + eps) * g, G", ("Adagrad",)),
    Mutant("adam-bias-lag", "Adam's bias corrections one step behind (1 - beta^(t-1))",
           "kernels/optim_rules.py", "[1.0 / (1.0 - h ** t) for t in steps]",
           "[1.0 / (1.0 - h ** max(t - 1, 1)) for t in steps]", ("Adam",)),
    Mutant("momentum-dampening", "Momentum without DataCode's (1 - beta)",
           "kernels/optim_rules.py", "v = beta * v + one_minus_beta * g", "v = beta * v + g",
           ("Momentum",)),
    Mutant("adamw-decay-lr", "AdamW's decoupled decay applied without the learning rate",
           "kernels/optim_rules.py",
           "return w - lr * add_decayed_weights(u, w, weight_decay), m, v",
           "return w - lr * u - weight_decay * w, m, v", ("AdamW",)),
    # -- layers and training --------------------------------------------------------------------
    Mutant("dense-transposed-weight-grad", "Dense's weight gradient transposed (g^T x reshaped)",
           "kernels/dense.py", "    weight_gradient(x, gpre, gw)\n    input_grad(",
           "    weight_gradient(x, gpre, gw)\n    gw[:, :] = np.dot(gpre.T, x).reshape(gw.shape)\n"
           "    input_grad(", ("train",)),
    Mutant("dense-stale-cache", "Dense keeps the first batch's input for every backward",
           "layers/dense.py",
           "self.hist_in, self.hist_pre, self.hist_post = x, pre, post",
           "self.hist_in = x if self.hist_in is None else self.hist_in\n"
           "        self.hist_pre, self.hist_post = pre, post", ("train",)),
    Mutant("clip-norm-float32", "the global gradient norm for clipping rounded to float32 "
           "(in a float64 run)", "training/clipping.py",
           "norm = math.sqrt(total) if finite else math.nan",
           "norm = float(np.float32(math.sqrt(total))) if finite else math.nan", ("train",)),
    Mutant("fused-row-bias", "the fused MLP epoch leaves out the second layer's bias",
           "kernels/dense_columns.py", "z = pre_f[i, j] + bias[j - c0]", "z = pre_f[i, j]",
           ("train",)),
    Mutant("fused-piece-overwrite", "the fused epoch's pieces overwrite each other's partial "
           "products instead of adding them", "kernels/dense_columns.py",
           "dst[i, j] += src[i, j]", "dst[i, j] = src[i, j]", ("train",)),
    Mutant("compiled-recurrent-piece-dropped", "the compiled epochs' skeleton adds only the "
           "first piece's partial gradients (batches past one piece lose the rest)",
           "kernels/skeleton.py", "    for p in range(1, n_pieces):\n",
           "    for p in range(1, min(n_pieces, 1)):\n", ("train",)),
    Mutant("compiled-lstm-step-carry", "the compiled LSTM backward drops the hidden-state "
           "gradient carried from step 1 into step 0", "kernels/recurrent.py",
           "        if t > 0:\n            dot_into(dz[t * nb:(t + 1) * nb], w_hh.T, dhc_all)",
           "        if t > 1:\n            dot_into(dz[t * nb:(t + 1) * nb], w_hh.T, dhc_all)",
           ("train",)),
    Mutant("compiled-recurrent-block-norm", "the compiled epochs' skeleton's gradient norm "
           "counts the first update block only", "kernels/skeleton.py",
           "    sumsq[k] = kopt._sum_squares(dst)\n",
           "    sumsq[k] = kopt._sum_squares(dst) if k == 0 else 0.0\n", ("train",)),
    Mutant("lstm-cell-carry", "LSTM backward carries the cell gradient through i, not f",
           "kernels/recurrent.py",
           "                    do[j] = dh * tc[j] * go[j] * (one - go[j])\n"
           "                    dcc[j] = dc * gf\n            else:",
           "                    do[j] = dh * tc[j] * go[j] * (one - go[j])\n"
           "                    dcc[j] = dc * gi[j]\n            else:", ("LSTM",)),
    Mutant("rnn-piece-carry", "RNN backward: a cell group starts from the scratch's leftover "
           "carry (the previous group's, not reset to 0)", "kernels/recurrent.py",
           "    cr_all = carry[:nb]\n    for b in range(nb):",
           "    cr_all = carry[:nb]\n    for b in range(0):", ("boundaries", "RNN")),
    Mutant("attention-scale", "attention scores scaled by 1/sqrt(d), not 1/sqrt(d/heads)",
           "layers/attention.py", "scale = self.dtype.type(1.0 / np.sqrt(d // heads))",
           "scale = self.dtype.type(1.0 / np.sqrt(d))", ("MultiHeadAttention",)),
    Mutant("embedding-overwrite", "repeated tokens overwrite instead of summing their gradients",
           "kernels/dense.py", "                tr[j] += gr[j]\n",
           "                tr[j] = gr[j]\n",
           ("Embedding",)),
    Mutant("tape-overwrite", "the tape overwrites a slot instead of adding the contribution",
           "tape.py", "else np.asarray(existing + contribution, self.dtype))",
           "else np.asarray(contribution, self.dtype))", ("tape",)),
    Mutant("tape-no-drop", "a parent with requires_grad False still receives gradient",
           "tape.py", "            if not self._requires_grad[parent]:\n                continue",
           "            if not self._requires_grad[parent]:\n                pass", ("tape",)),
    # -- TargetProp and contrastive divergence -------------------------------------------------
    Mutant("cd-positive-phase", "CD gradient adds the positive phase instead of subtracting it",
           "rbm.py", "gW -= np.dot(v0.T, ph0)", "gW += np.dot(v0.T, ph0)", ("cd",)),
    Mutant("targetprop-budget", "link budget cos(y, t) instead of (cos + 1)/2",
           "kernels/targetprop.py",
           "budget = (dot / (np.sqrt(na) * np.sqrt(nt)) + 1.0) / 2.0",
           "budget = dot / (np.sqrt(na) * np.sqrt(nt))", ("targetprop",)),
    # -- a second, independent round: bugs written apart from the ones above ---------------------
    Mutant("adamw-coupled-decay", "AdamW's weight decay folded into the gradient (L2, coupled "
           "through the moments) instead of decoupled", "kernels/optim_rules.py",
           "    u, m, v = scale_by_adam(g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2,\n"
           "                            inv_bias_beta1, inv_bias_beta2, eps)\n"
           "    return w - lr * add_decayed_weights(u, w, weight_decay), m, v",
           "    u, m, v = scale_by_adam(g + weight_decay * w, m, v, beta1, one_minus_beta1, "
           "beta2,\n                            one_minus_beta2, inv_bias_beta1, inv_bias_beta2, "
           "eps)\n    return w - lr * u, m, v", ("AdamW",)),
    Mutant("adam-eps-inside", "Adam with eps inside the square root of v_hat",
           "kernels/optim_rules.py", "(sqrt(v * inv_bias_beta2) + eps)",
           "sqrt(v * inv_bias_beta2 + eps)", ("Adam",)),
    Mutant("categorical-ce-sum-one", "categorical_cross_entropy's float32 gradient assumes "
           "every target row sums to 1 (softmax - t, not softmax·sum(t) - t)", "kernels/loss.py",
           "gz[n, j] = (p * total - np.float64(tr[j])) * gscale",
           "gz[n, j] = (p - np.float64(tr[j])) * gscale", ("categorical_cross_entropy",)),
    Mutant("axis-empty-means-all", "axis=() read as axis=None (reduces every axis, not none)",
           "ops.py", "axes = _shapes.resolve_axes(name, p[\"axis\"], a[0].ndim)",
           "axes = _shapes.resolve_axes(name, p[\"axis\"] if p[\"axis\"] != () else None, "
           "a[0].ndim)", ("sum", "mean", "logsumexp")),
    Mutant("row-max-lane-group", "the vectorised row maximum skips its last group of 16 lanes "
           "(a shift below the true maximum: exp overflows)", "kernels/reduce.py",
           "for i in range(16, k, 16):", "for i in range(16, k - 16, 16):",
           ("logsumexp", "softmax")),
    Mutant("lse-pieces-first-max", "a long log-sum-exp row's pieces combined relative to the "
           "first piece's maximum, not the largest", "kernels/reduce.py",
           "        m = pmax[row, 0]\n        for k in range(1, pmax.shape[1]):\n"
           "            m = max(m, pmax[row, k])\n",
           "        m = pmax[row, 0]\n", ("logsumexp",)),
    Mutant("targetprop-route-at-threshold", "the route's row gate opens at Σ|W| = θ (>= instead "
           "of >)", "kernels/targetprop.py",
           "scales[i] = 1.0 / total if total > threshold else 0.0",
           "scales[i] = 1.0 / total if total >= threshold else 0.0", ("targetprop",)),
    Mutant("cd-uniform-reuse", "CD-k's later Gibbs steps sample with the previous step's "
           "uniforms", "rbm.py",
           "kernels.sample_bernoulli(ph.reshape(-1), u[s].reshape(-1), h.reshape(-1))",
           "kernels.sample_bernoulli(ph.reshape(-1), u[s - 1].reshape(-1), h.reshape(-1))",
           ("cd",)),
    Mutant("cross-entropy-log-not-log1p", "cross_entropy's row loss takes log(s) for "
           "log1p(s - 1): a dominant logit's loss of 1e-17 rounds to 0",
           "kernels/loss.py", "tail = math.log1p(rest) if v[t] == m else math.log(s)",
           "tail = math.log(s)", ("special",)),
    Mutant("compiled-program-recurrent-subpiece", "a recurrent layer's w_hh gradient keeps only "
           "the last cell group's terms (overwrites, not adds)",
           "kernels/recurrent.py", "                    gr[j] += pr[j]\n",
           "                    gr[j] = pr[j]\n", ("train",)),
    # -- every path at every parameter, and the conventions -------------------------------------
    Mutant("layer-norm-layer-unweighted", "the LayerNorm layer's backward forms mean(g·x̂) "
           "without the affine weight (exact while the weight is all ones)", "kernels/dense.py",
           "            mean_gx += g * hr[j]\n",
           "            mean_gx += dr[j] * hr[j]\n", ("train",)),
    Mutant("fused-cce-sum-one", "the fused epoch's categorical cross-entropy gradient assumes "
           "the targets sum to 1 (softmax - t, not softmax · Σt - t)",
           "kernels/batch_loss.py",
           "dz[i, j] = (math.exp(z[i, j] - lse) * t_sum - yf[r, j]) * inv_n",
           "dz[i, j] = (math.exp(z[i, j] - lse) - yf[r, j]) * inv_n", ("train",)),
    Mutant("dense-bias-f32-accumulation", "a float32 Dense's bias gradient accumulated in "
           "float32 (a running sum that drops terms below half an ulp of the total)",
           "layers/dense.py", "np.empty(self.out_features, np.float64), gin, mode,",
           "np.empty(self.out_features, self.dtype), gin, mode,", ("Dense bias sum",)),
    Mutant("dense-relu-derivative-leaky", "a relu Dense's backward takes leaky_relu's "
           "derivative (the slope, not 0, where the pre-activation is negative) on every path",
           "kernels/dense.py", "        return scalar.relu_df(z)\n",
           "        return scalar.leaky_relu_df(z, slope)\n", ("kinked Dense",)),
    Mutant("bce-logits-fused-value-linear-part", "binary_cross_entropy_with_logits' value "
           "computed with its gradient (what training reads) drops the linear part; the "
           "forward alone keeps it", "kernels/loss.py",
           "        terms[i] = lin + np.float64(_log1p_unit(ei))\n",
           "        terms[i] = np.float64(_log1p_unit(ei))\n", ("exact",)),
    # -- conditioning: results that lose their relative accuracy where the op saturates ----
    Mutant("sigmoid-vjp-from-output", "sigmoid' formed from the output, s (1 - s) (PyTorch's "
           "way: 0 once s rounds to 1, 4000 ulp off at x = 10)", "kernels/scalar.py",
           "    e = exp(-abs(x))\n    d = like(x, 1.0) + e\n    return e / (d * d)\n",
           "    s = _sigmoid_pair(x)[0]\n    return s * (like(x, 1.0) - s)\n",
           ("sigmoid",)),
    Mutant("tanh-vjp-from-output", "tanh' formed from the output, 1 - tanh², which cancels to 0 "
           "once tanh rounds to ±1", "kernels/scalar.py",
           "    e = exp(like(x, -2.0) * abs(x))\n    d = like(x, 1.0) + e\n"
           "    return like(x, 4.0) * e / (d * d)\n",
           "    t = tanh(x)\n    return like(x, 1.0) - t * t\n", ("tanh",)),
    Mutant("gelu-phi-through-erf", "float32 gelu's Phi as (1 + erf(x / sqrt 2)) / 2, which "
           "cancels in the lower tail (0 from x = -8.3)", "kernels/vecmath.py",
           "    y = np.float32(half if xd < 0 else 1.0 - half)\n",
           "    y = np.float32(0.5 * (1.0 + math.erf(xd * _SQRT1_2)))\n", ("gelu",)),
    Mutant("layer-norm-one-pass-variance", "layer_norm's variance as mean(x²) - mean(x)², "
           "which cancels on rows whose mean is large against their spread",
           "kernels/norm.py",
           "            t = np.float64(v[j]) - mu\n            dev[j] = t * t\n"
           "        r = 1.0 / math.sqrt(_pairwise_sum(dev, 0, d) / d + eps)\n",
           "            dev[j] = np.float64(v[j]) * np.float64(v[j])\n"
           "        r = 1.0 / math.sqrt(_pairwise_sum(dev, 0, d) / d - mu * mu + eps)\n",
           ("layer_norm",)),
    Mutant("maximum-nan-routing", "maximum sends the gradient to b where a is NaN (the forward "
           "still returns a's NaN)", "kernels/binary.py",
           "return x >= y or x != x", "return x >= y", ("maximum NaN routing",)),
    # -- the 16-bit storage formats: the conversions (the planted ones: lowp_mutants) --------
    Mutant("bfloat16-truncating-conversion", "float32 -> bfloat16 truncates (the top 16 bits, "
           "rounding toward zero) instead of rounding to nearest even", "kernels/half.py",
           "    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16\n", "    return b >> 16\n",
           ("tanh", "exp")),
    Mutant("float16-truncating-conversion", "float32 -> float16 drops the 13 low bits (rounding "
           "toward zero) instead of rounding to nearest even", "kernels/half.py",
           "        return sign | ((a + 0xFFF + ((a >> 13) & 1)) >> 13)\n",
           "        return sign | (a >> 13)\n", ("tanh", "exp")),
    # -- mixed-precision training (fastlib/training/mixed_precision.py) ------------------------
    Mutant("loss-scale-not-undone", "float16 mixed-precision training leaves the loss scale "
           "on the last parameter's gradient (not divided back out before the step)",
           "training/mixed_precision.py",
           "grads = {k: np.ascontiguousarray(grads[k] * inverse, dtype=np.float32) "
           "for k in ctx.params}",
           "grads = {k: np.ascontiguousarray(grads[k] * (inverse if k != list(ctx.params)[-1] "
           "else np.float32(1)), dtype=np.float32) for k in ctx.params}",
           ("loss scale", "mixed MLP")),
    Mutant("skipped-step-not-skipped", "a step whose scaled gradient overflowed is counted as "
           "skipped (and the scale backs off) but the optimizer still takes it",
           "training/mixed_precision.py",
           "    if found_inf:\n        return BatchResult(loss, correct, True, grads)\n",
           "    if found_inf:\n        ctx.opt_state = ctx.optimizer.update(ctx.params, grads, "
           "ctx.opt_state, lr=ctx.lr)\n        return BatchResult(loss, correct, True, grads)\n",
           ("loss scale", "mixed MLP")),
    # -- the same two in the compiled MLP epoch (fastlib/kernels/dense_columns.py) -------------
    Mutant("compiled-loss-scale-not-undone", "the compiled MLP epoch in mixed precision leaves "
           "the loss scale on the gradient (rounded, never multiplied by the reciprocal)",
           "kernels/dense_columns.py",
           "half.round_scale_in_place(prec.code, state.g[lo:hi], unscale)",
           "half.round_in_place(prec.code, state.g[lo:hi])",
           ("loss scale", "mixed MLP")),
    Mutant("compiled-skipped-step-not-skipped", "the compiled MLP epoch counts a step with an "
           "inf/NaN gradient as skipped (and the loss scale backs off) but still applies it",
           "kernels/dense_columns.py",
           "        if not apply:\n            skipped += 1\n            continue\n",
           "        if not apply:\n            skipped += 1\n", ("loss scale", "mixed MLP")),
    # -- and in the interpreter, whose steps end in the skeleton (fastlib/kernels/skeleton.py) --
    Mutant("interpreter-loss-scale-not-undone", "the interpreter's step end in mixed "
           "precision leaves the loss scale on the summed gradient (rounded, never multiplied "
           "by the reciprocal)", "kernels/skeleton.py",
           "        half.round_scale_in_place(code, dst, unscale)",
           "        half.round_in_place(code, dst)", ("loss scale", "mixed MLP")),
    Mutant("interpreter-skipped-step-not-skipped", "the interpreter's step end counts a step "
           "with an inf/NaN gradient as skipped (and the loss scale backs off) but still "
           "applies it", "kernels/skeleton.py",
           "    if apply:\n        update_region(", "    if True:\n        update_region(",
           ("loss scale", "mixed MLP")),
    # -- a rounding point of a mixed-precision step skipped, on each path: within the format's
    # roundoff of the exact run (the rows above pass them); the step-by-step replay does not
    Mutant("mixed-output-not-rounded", "the per-batch mixed path leaves each layer's output "
           "in float32 (never rounded to the 16-bit format)", "training/mixed_precision.py",
           "x = round_to(unit.forward(x), fmt)", "x = unit.forward(x)", ("rounding points",)),
    Mutant("mixed-cotangent-not-rounded", "the per-batch mixed path passes each layer's input "
           "cotangent down unrounded", "training/mixed_precision.py",
           "            g = round_to(g, fmt)", "            g = g", ("rounding points",)),
    Mutant("mixed-masters-not-rounded", "the per-batch mixed path's forward and backward read "
           "the float32 masters, not their 16-bit values", "training/mixed_precision.py",
           "            round_to(v, self.fmt, out=v)", "            pass",
           ("rounding points",)),
    Mutant("compiled-output-not-rounded", "the compiled MLP epoch stores a column layer's "
           "output unrounded", "kernels/dense_columns.py",
           "half.round_in_place(fmt, bufs.post[op:op + nb * width])   # the layer's output, "
           "stored", "pass", ("rounding points",)),
    Mutant("interpreter-output-not-rounded", "the interpreter leaves each unit's output "
           "unrounded", "kernels/interpreter.py",
           "            _round_slot(code, act, slots[plan.rounds[k, 0]], n)",
           "            pass", ("rounding points",)),
    Mutant("interpreter-cotangent-not-rounded", "the interpreter leaves each unit's input "
           "cotangent unrounded", "kernels/interpreter.py",
           "            _round_slot(code, gact, slots[plan.rounds[k, 1]], n)",
           "            pass", ("rounding points",)),
    Mutant("rounds-first-writer", "the interpreter rounds a unit's output after the first row "
           "that writes it, not the last (a residual join adds to it after)",
           "training/program.py", "rounds[writers[-1], 0] = s", "rounds[writers[0], 0] = s",
           ("rounding points",)),
    Mutant("masters-not-rounded-into-w16", "both compiled epochs copy the updated masters into "
           "the weights the next step reads, unrounded", "kernels/skeleton.py",
           "    half.round_into(code, w[lo:hi], w16[lo:hi])", "    w16[lo:hi] = w[lo:hi]",
           ("rounding points",)),
)


# Mutants kept in other modules join every run (``--mutants``, the slow test) through this
# tuple of module names. Each such module defines its own ``MUTANTS``, a tuple of ``Mutant``
# (it imports ``Mutant`` from here, so it is imported lazily, by ``all_mutants``). To register
# one, add its dotted name here. (Context-manager mutants join through ``HOOK_MODULES`` below.)
MUTANT_MODULES = ()


# Modules whose ``MUTANTS`` maps a name to a context-manager mutant (a ``TrainingMutant``): each
# becomes a ``HookMutant``, run after the source mutants, with the rows of ``first`` first.
HOOK_MODULES = (("reports.conformance.training_mutants", ("train",)),
                ("reports.conformance.program_mutants", ("program",)),
                ("reports.conformance.lowp_mutants", ("sum", "mean", "softmax")))


def hook_mutants():
    """A ``HookMutant`` for every mutant of every module in ``HOOK_MODULES``, in their order."""
    out = []
    for module, first in HOOK_MODULES:
        for m in importlib.import_module(module).MUTANTS.values():
            out.append(HookMutant(m.name, m.description, module, first))
    return tuple(out)


def all_mutants():
    """``MUTANTS``, the ``MUTANTS`` of every module in ``MUTANT_MODULES``, then ``hook_mutants()``.

    Returns
    -------
    tuple of Mutant and HookMutant
        In that order; ``check_targets`` refuses a key used twice, across modules and kinds.
    """
    out = list(MUTANTS)
    for name in MUTANT_MODULES:
        out += list(importlib.import_module(name).MUTANTS)
    return tuple(out) + hook_mutants()

def run_all(mutants=None, profile="dev", seed=0, progress=None, control=True):
    """Run the control and every mutant (default ``all_mutants()``); return (control result or
    None, [MutantResult])."""
    import tempfile

    mutants = all_mutants() if mutants is None else mutants
    problems = check_targets(mutants)
    if problems:
        raise MutantError("; ".join(problems))
    with tempfile.TemporaryDirectory(prefix="verigrad-exact-cache-") as cache:
        ctrl = None
        if control:
            if progress:
                progress("control")
            ctrl = run_control(profile, seed, cache)
        results = []
        for m in mutants:
            if progress:
                progress(m.key)
            results.append(run_mutant(m, profile, seed, cache))
    return ctrl, results
