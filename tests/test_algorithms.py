"""Pluggable training algorithms: "bp", "targetprop", "cd" and a custom one.

Oracles: a training run is replayed step by step with the public per-step functions
(``fastlib.targetprop``, ``fastlib.rbm.cd_gradients``) and with the reference engine
(``reflib.targetprop``, ``reflib.rbm.cd_train_step``) on the same batches and the same uniforms
(the run's Generator is ``numpy.random.default_rng(seed)``; with ``shuffle=False`` the loop draws
nothing else from it). Replays with fastlib's own functions must be bit-for-bit equal (same code,
same order); against reflib the float64 tolerance is ``F64_TOL`` (test_targetprop.py's bound:
~60 products per entry through three layers, 1e-11 of the array scale; the optimizer adds one
rounding per step).
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
import fastlib.rbm as fr
import fastlib.targetprop as ft
import reflib.rbm as rr
import reflib.targetprop as rt
from fastlib.datasets import load_digits
from fastlib.training import ALGORITHMS, Algorithm, BatchResult, get_algorithm, register_algorithm
from reflib.models import twin

F64_TOL = 1e-11


def _close(actual, expected, tol, what):
    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = max(float(np.max(np.abs(e))), 1e-300)
    err = float(np.max(np.abs(a - e)))
    assert err <= tol * scale, f"{what}: max error {err:.3e} > {tol:.0e} x scale {scale:.3e}"


@pytest.fixture(scope="module")
def digits():
    return load_digits(dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# the registry

def test_three_algorithms_are_registered_the_same_way():
    for name in ("bp", "targetprop", "cd"):
        algo = get_algorithm(name)
        assert isinstance(algo, Algorithm) and ALGORITHMS[name] is algo
        assert callable(algo.train_one_batch)
    assert get_algorithm("cd").needs_targets is False
    assert get_algorithm("TargetProp") is get_algorithm("targetprop")
    with pytest.raises(ValueError, match="did you mean 'targetprop'"):
        get_algorithm("targetprob")


# The README's custom algorithm: feedback alignment (Lillicrap et al. 2016) registered as a
# TrainOneBatch. The error travels back through fixed random matrices instead of Wᵀ.
def feedback_alignment_init(ctx):
    for i, layer in enumerate(ctx.model.layers[1:], start=1):
        ctx.state[f"feedback/{i}"] = ctx.rng.normal(
            0.0, 1.0 / np.sqrt(layer.out_features),
            (layer.out_features, layer.in_features)).astype(layer.dtype)


def feedback_alignment_step(ctx, x, y):
    layers = ctx.model.layers
    pred = ctx.model.forward(x)                      # every layer records its history
    loss, g = fastlib.losses.loss_value_and_grad(ctx.loss_type, pred, y, check=False)
    acc = fastlib.losses.accuracy(ctx.loss_type, pred, y, check=False)
    grads = {}
    for i in range(len(layers) - 1, -1, -1):
        _, own = layers[i].backward(g, need_input_grad=False)   # this layer's weight gradient
        grads.update({f"{i}.{name}": value for name, value in own.items()})
        if i > 0:
            if layers[i].activation == "relu":
                g = g * (layers[i].hist_pre > 0)
            g = g @ ctx.state[f"feedback/{i}"]       # B_i in place of W_iᵀ
    ctx.opt_state = ctx.optimizer.update(ctx.params, grads, ctx.opt_state, lr=ctx.lr)
    return BatchResult(loss, None if acc is None else acc * x.shape[0])


@pytest.fixture
def feedback_alignment():
    """feedback_alignment registered for one test, then removed: the registry is process-wide
    (other tests, under pytest-xdist in the same worker, read its names)."""
    from fastlib.training.algorithms import ALGORITHMS

    register_algorithm("feedback_alignment", feedback_alignment_step,
                       init=feedback_alignment_init, overwrite=True)
    yield
    ALGORITHMS.pop("feedback_alignment", None)


def test_custom_algorithm_registers_and_trains(digits, feedback_alignment):
    model = fastlib.Sequential([fastlib.Dense(64, 32, "relu"), fastlib.Dense(32, 10)], seed=0)
    result = fastlib.train(model, digits.x_train, digits.y_train, 4, 32, 0.05, "cross_entropy",
                           digits.x_test, digits.y_test, "Momentum",
                           algorithm="feedback_alignment", verbose=False)
    assert result.loss_history[-1] < 0.5 * result.loss_history[0]
    assert result.val_accuracy_history[-1] > 0.8     # chance is 0.1
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("feedback_alignment", feedback_alignment_step)


# ---------------------------------------------------------------------------------------------
# targetprop

def _tp_model(dtype=np.float64):
    return fastlib.Sequential([fastlib.Dense(64, 12, "tanh"),
                               fastlib.Sequential([fastlib.Dense(12, 10)])], dtype=dtype, seed=4)


@pytest.mark.parametrize("chain", [True, False], ids=["chain_rule", "pure"])
def test_targetprop_training_replays_step_by_step(digits, chain):
    x, y = digits.x_train[:48], digits.y_train[:48]
    model = _tp_model()
    manual = _tp_model()
    ref = twin(manual)
    fastlib.train(model, x, y, 1, 16, 0.2, "cross_entropy", shuffle=False,
                  algorithm="targetprop", use_chain_rule=chain, verbose=False)
    cfg = ft.TargetPropConfig(use_chain_rule=chain)
    fs = ft.TargetPropState(manual, cfg)
    rs = rt.TargetPropState(ref, rt.TargetPropConfig(use_chain_rule=chain))
    for start in range(0, 48, 16):
        xb, yb = x[start:start + 16], y[start:start + 16]
        out = ft.targetprop_forward(manual, fs, xb)
        ft.targetprop_backward(manual, fs, ft.output_target("cross_entropy", out, yb))
        fs.calculate_link_budgets()
        ft.apply_targetprop_gaps(manual, fs, 0.2)
        rout = rt.targetprop_forward(ref, rs, xb)
        rt.targetprop_backward(ref, rs, rt.output_target("cross_entropy", rout, yb))
        rs.calculate_link_budgets()
        rt.apply_targetprop_gaps(ref, rs, 0.2)
        assert fs.updated == rs.updated
    for name, value in model.parameters().items():
        np.testing.assert_array_equal(value, manual.parameters()[name])    # same code: exact
        _close(value, ref.parameters()[name], F64_TOL, name)


def test_targetprop_learns_digits(digits):
    model = fastlib.Sequential([fastlib.Dense(64, 32, "relu"), fastlib.Dense(32, 10)], seed=0)
    result = fastlib.train(model, digits.x_train, digits.y_train, 3, 32, 0.1, "cross_entropy",
                           digits.x_test, digits.y_test, algorithm="targetprop", verbose=False)
    assert result.loss_history[-1] < result.loss_history[0]
    assert result.val_accuracy_history[-1] > 0.6     # chance is 0.1


def test_targetprop_resume_is_exact(digits, tmp_path):
    x, y = digits.x_train[:64], digits.y_train[:64]
    straight = _tp_model()
    fastlib.train(straight, x, y, 2, 16, 0.1, "cross_entropy", algorithm="targetprop",
                  verbose=False)
    first = _tp_model()
    path = tmp_path / "tp.npz"
    fastlib.train(first, x, y, 1, 16, 0.1, "cross_entropy", algorithm="targetprop",
                  checkpoint=path, verbose=False)
    resumed = _tp_model()
    fastlib.train(resumed, x, y, 2, 16, 0.1, "cross_entropy", algorithm="targetprop",
                  resume=path, verbose=False)
    for name, value in straight.parameters().items():
        np.testing.assert_array_equal(resumed.parameters()[name], value)


def test_targetprop_options_and_errors(digits):
    x, y = digits.x_train[:8], digits.y_train[:8]
    with pytest.raises(TypeError, match="did you mean 'use_chain_rule'"):
        fastlib.train(_tp_model(), x, y, 1, 8, 0.1, "cross_entropy", algorithm="targetprop",
                      use_chain_rul=False, verbose=False)
    # every field of TargetPropConfig by name, one close to train's own gradient_clip too
    scaled = _tp_model()
    fastlib.train(scaled, x, y, 1, 8, 0.1, "cross_entropy", algorithm="targetprop",
                  gradient_scale=0.3, verbose=False)
    configured = _tp_model()
    fastlib.train(configured, x, y, 1, 8, 0.1, "cross_entropy", algorithm="targetprop",
                  targetprop_config=ft.TargetPropConfig(gradient_scale=0.3), verbose=False)
    for name, value in scaled.parameters().items():
        assert np.array_equal(value, configured.parameters()[name]), name
    with pytest.raises(ValueError, match="not supported"):
        model = fastlib.Sequential([fastlib.Dense(64, 10), fastlib.LayerNorm(10)])
        fastlib.train(model, x, y, 1, 8, 0.1, "cross_entropy", algorithm="targetprop",
                      verbose=False)
    cfg = ft.TargetPropConfig(use_chain_rule=False, depth_scale_factor=1.0)
    model = _tp_model()
    fastlib.train(model, x, y, 1, 8, 0.1, "cross_entropy", algorithm="targetprop",
                  targetprop_config=cfg, verbose=False)


# ---------------------------------------------------------------------------------------------
# cd

@pytest.mark.parametrize("k", [1, 3])
def test_cd_training_replays_with_the_reference(digits, k):
    x = digits.x_train[:40]
    rbm = fr.RBM(64, 8, dtype=np.float64, seed=2)
    ref_params = {n: v.copy() for n, v in rbm.parameters().items()}
    fastlib.train(rbm, x, None, 1, 20, 0.01, None, optimizer="Adam", shuffle=False, seed=7,
                  algorithm="cd", cd_k=k, verbose=False)
    rng = np.random.default_rng(7)       # the run's Generator: uniforms batch after batch
    state = None
    for start in (0, 20):
        u = rng.random((k, 20, 8))
        _, ref_params, state = rr.cd_train_step(ref_params, x[start:start + 20], u, "Adam",
                                                state=state, lr=0.01)
    for name, value in rbm.parameters().items():
        _close(value, ref_params[name], F64_TOL, name)


def test_cd_learns_and_records_its_metrics(digits):
    rbm = fr.RBM(64, 24, seed=0)
    result = fastlib.train(rbm, digits.x_train, None, 4, 32, 0.1, None, optimizer="Momentum",
                           algorithm="cd", verbose=False)
    recon = rbm.history["reconstruction_error"]
    assert len(recon) == len(rbm.history["free_energy"]) == 4
    assert recon == result.loss_history
    assert recon[-1] < recon[0]
    assert all(a is None for a in result.accuracy_history)
    assert rbm.reconstruction_error(digits.x_test) < 0.1     # pixels are in [0, 1]


def test_cd_errors(digits):
    x = digits.x_train[:10]
    with pytest.raises(TypeError, match="fastlib.RBM"):
        fastlib.train(fastlib.Sequential([fastlib.Dense(64, 3)]), x, None, 1, 5, 0.1, None,
                      algorithm="cd", verbose=False)
    with pytest.raises(ValueError, match="cd_k"):
        fastlib.train(fr.RBM(64, 3), x, None, 1, 5, 0.1, None, algorithm="cd", cd_k=0,
                      verbose=False)
    with pytest.raises(TypeError, match=r"unexpected option\(s\) \['k'\] for algorithm 'cd'.*"
                                        r"it takes \['cd_k'\]"):
        fastlib.train(fr.RBM(64, 3), x, None, 1, 5, 0.1, None, algorithm="cd", k=2,
                      verbose=False)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fastlib.train(fr.RBM(64, 3), x * 16, None, 1, 5, 0.1, None, algorithm="cd",
                      verbose=False)


# ---------------------------------------------------------------------------------------------
# verigrad train --algorithm targetprop | cd

def test_cli_trains_with_targetprop_and_cd(tmp_path, capsys):
    from reports.cli import main

    assert main(["train", "--algorithm", "targetprop", "--pure", "--epochs", "1",
                 "--lr", "0.1", "--hidden", "16"]) == 0
    assert "test accuracy" in capsys.readouterr().out
    plot = tmp_path / "rbm.png"
    assert main(["train", "--algorithm", "cd", "--cd-k", "2", "--epochs", "2", "--hidden", "16",
                 "--optimizer", "SGD", "--lr", "0.1", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "RBM 64-16, CD-2" in out and "test reconstruction error" in out
    assert plot.stat().st_size > 0
    assert main(["train", "--pure", "--epochs", "1"]) == 2     # --pure needs targetprop: a usage error


def test_cd_validates_on_x_val_alone_and_bp_still_needs_y_val():
    """An algorithm without targets validates on images alone; bp refuses half a validation set."""
    rng = np.random.default_rng(0)
    x = (rng.random((40, 6)) < 0.5).astype(np.float64)
    rbm = fastlib.RBM(6, 3, dtype=np.float64, seed=0)
    result = fastlib.train(rbm, x[:30], None, 2, 10, 0.1, None, x[30:], None, "SGD",
                           algorithm="cd", verbose=False)
    assert len(result.val_loss_history) == 2
    assert all(np.isfinite(result.val_loss_history))
    model = fastlib.Sequential([fastlib.Dense(6, 2)], dtype=np.float64)
    with pytest.raises(ValueError, match="x_val was given without y_val"):
        fastlib.train(model, x, np.zeros((40, 1)), 1, 10, 0.1, "cross_entropy", x[30:], None,
                      verbose=False)
