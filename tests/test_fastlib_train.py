"""fastlib.train / train_sh: the loop, the plateau policy, clipping, explosions, checkpoints,
algorithms, and the fused MLP path.

Independent sources: hand-derived policy decisions and clipping results; reflib's training step
(exact-tape gradients and spec's update) for what a run of ``train`` must produce batch by batch;
PyTorch's ``clip_grad_norm_`` as a peer; bit-for-bit equality between an interrupted and an
uninterrupted run (the same code path twice, so equality is exact by construction of the RNG and
state handling, not a tolerance).
"""
from __future__ import annotations

import numpy as np
import pytest

import fastlib
from fastlib import optim
from fastlib.training import (PlateauPolicy, TrainingHistorySH, TrainingResult, clip_gradients,
                           register_algorithm)
from fastlib.training import algorithms

# float64 runs of the two fastlib paths, or fastlib against reflib: gradients differ by
# summation order (~1e-16 relative per element); a few epochs of Adam/SGD on small, well-
# conditioned problems keep the parameters within ~1e-13 relative; 1e-10 leaves margin while any
# error in the math (wrong batch, wrong coefficient, a skipped bias) is O(1e-3) or larger.
PATH_RTOL = 1e-10


def mlp(activation="relu", out=3, dtype=np.float64, seed=0, width=6, d_in=5):
    return fastlib.Sequential([fastlib.Dense(d_in, width, activation),
                               fastlib.Dense(width, out)], dtype=dtype, seed=seed)


def data(n=23, d_in=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in))
    y = rng.integers(0, classes, size=(n, 1))
    return x, y


def targets_for(loss, y, classes=3, rng=None):
    rng = rng or np.random.default_rng(1)
    if loss == "cross_entropy":
        return y
    if loss == "categorical_cross_entropy":
        return fastlib.onehot(y, classes, dtype=np.float64)
    if loss == "mse":
        return rng.standard_normal((len(y), classes))
    return (rng.random((len(y), classes)) > 0.5).astype(np.float64)  # bce with logits


def params_close(a, b, rtol=PATH_RTOL):
    for k in a:
        scale = max(np.max(np.abs(b[k])), 1e-300)
        assert np.max(np.abs(a[k] - b[k])) <= rtol * scale, k


def quiet(**kw):
    return dict(verbose=False, **kw)


# ---------------------------------------------------------------------------------------------
# the plateau policy on constructed sequences (decisions derived by hand)

def feed(policy, values):
    return [policy.step(v) for v in values]


def test_policy_min_delta_is_a_percentage_of_the_best():
    p = PlateauPolicy(lr=1.0, monitor="loss", patience=5, min_delta=1.0)
    d = feed(p, [1.0, 0.995, 0.989, 0.98])
    # 1.0 first -> best; 0.995 is 0.5% better (< 1%): no; 0.989 is 1.1% better: yes;
    # 0.98 vs 0.989 is 0.91% better: no
    assert [x.improved for x in d] == [True, False, True, False]
    assert p.best == 0.989 and p.best_epoch == 3 and p.wait == 1


def test_policy_accuracy_is_maximised_and_zero_delta_means_strict():
    p = PlateauPolicy(lr=1.0, monitor="val_acc", patience=5, min_delta=0.0)
    d = feed(p, [0.5, 0.5, 0.6, 0.59, float("nan"), 0.61])
    assert [x.improved for x in d] == [True, False, True, False, False, True]
    assert p.best == 0.61 and p.best_epoch == 6


def test_policy_reduces_lr_after_patience_and_restarts_the_count():
    p = PlateauPolicy(lr=0.1, monitor="loss", patience=2, min_delta=0.0, lr_factor=0.5)
    d = feed(p, [1.0, 1.0, 1.0, 1.0, 1.0])
    # epochs 2, 3 without improvement -> reduce at 3 (wait restarts); epochs 2..5 make
    # since_best = 4 = the default stop_patience (2 x 2) -> stop at 5, before a second reduction
    assert [x.reduced for x in d[:4]] == [False, False, True, False]
    assert d[4].stop and not d[4].reduced and "stop_patience=4" in d[4].reason
    assert d[2].lr == pytest.approx(0.05) and p.reductions == 1


def test_policy_stop_patience_counts_since_best_not_since_reduction():
    p = PlateauPolicy(lr=1.0, monitor="loss", patience=2, stop_patience=5, min_delta=0.0)
    d = feed(p, [3.0, 3.0, 3.0, 3.0, 3.0, 3.0])
    assert [x.reduced for x in d] == [False, False, True, False, True, False]
    assert [x.stop for x in d] == [False] * 5 + [True]
    assert [x.lr for x in d] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]


def test_policy_improvement_resets_both_counters():
    p = PlateauPolicy(lr=1.0, monitor="loss", patience=2, min_delta=0.0)
    d = feed(p, [2.0, 2.0, 1.0, 1.5, 1.5])
    assert [x.reduced for x in d] == [False, False, False, False, True]
    assert p.best_epoch == 3 and not any(x.stop for x in d)


def test_policy_stops_when_lr_falls_below_min_lr():
    p = PlateauPolicy(lr=1e-3, monitor="loss", patience=1, stop_patience=100, min_lr=2e-4)
    d = feed(p, [1.0, 1.0, 1.0, 1.0])
    # 1e-3 -> 5e-4 (epoch 2) -> 2.5e-4 (epoch 3) -> 1.25e-4 < 2e-4: stop at epoch 4
    assert [x.stop for x in d] == [False, False, False, True]
    assert "min_lr" in d[3].reason and d[3].lr == pytest.approx(1.25e-4)


def test_policy_state_dict_resumes_the_same_decisions():
    values = [1.0, 0.9, 0.95, 0.96, 0.97, 0.5, 0.6, 0.7, 0.8]
    full = PlateauPolicy(lr=1.0, monitor="loss", patience=2, min_delta=0.5)
    expect = feed(full, values)
    first = PlateauPolicy(lr=1.0, monitor="loss", patience=2, min_delta=0.5)
    got = feed(first, values[:4])
    again = PlateauPolicy.from_state_dict(first.state_dict())
    got += feed(again, values[4:])
    assert got == expect


@pytest.mark.parametrize("kw, words", [
    ({"monitor": "accuracy"}, "monitor must be one of"),
    ({"patience": 0}, "patience"),
    ({"min_delta": -1.0}, "percentage"),
    ({"lr_factor": 1.5}, "lr_factor"),
    ({"stop_patience": 0}, "stop_patience"),
])
def test_policy_rejects_bad_settings(kw, words):
    with pytest.raises(ValueError, match=words):
        PlateauPolicy(lr=1.0, **kw)


# ---------------------------------------------------------------------------------------------
# clipping

def test_clip_value_clamps_elementwise():
    g = {"a": np.array([[-3.0, 0.5], [2.0, -0.1]]), "b": np.array([10.0])}
    info = clip_gradients(g, 1.0, "value")
    assert np.array_equal(g["a"], [[-1.0, 0.5], [1.0, -0.1]]) and np.array_equal(g["b"], [1.0])
    # norm before clipping: sqrt(9 + 0.25 + 4 + 0.01 + 100)
    assert info.finite and info.norm == pytest.approx(np.sqrt(113.26), rel=1e-15)


def test_clip_norm_scales_all_parameters_together():
    g = {"a": np.array([3.0]), "b": np.array([[0.0, 4.0]], np.float32)}
    info = clip_gradients(g, 1.0, "norm")
    assert info.norm == 5.0
    assert np.allclose(g["a"], [0.6], rtol=1e-15) and np.allclose(g["b"], [[0.0, 0.8]], rtol=1e-7)
    small = {"a": np.array([0.3, 0.4])}
    clip_gradients(small, 1.0, "norm")  # norm 0.5 <= 1: untouched
    assert np.array_equal(small["a"], [0.3, 0.4])


def test_clip_norm_matches_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    g = {"a": rng.standard_normal((4, 5)), "b": rng.standard_normal(7)}
    ts = [torch.tensor(v.copy(), requires_grad=True) for v in g.values()]
    for t, v in zip(ts, g.values()):
        t.grad = torch.tensor(v.copy())
    torch.nn.utils.clip_grad_norm_(ts, 0.7)
    clip_gradients(g, 0.7, "norm")
    for t, v in zip(ts, g.values()):
        # torch scales by clip / (norm + 1e-6); we scale by clip / norm: a 1e-6 relative gap
        assert np.allclose(v, t.grad.numpy(), rtol=1e-5, atol=0)


def test_nonfinite_gradient_is_reported_and_left_alone():
    g = {"a": np.array([1.0, np.nan, 5.0])}
    info = clip_gradients(g, 1.0, "value")
    assert not info.finite and g["a"][2] == 5.0
    with pytest.raises(ValueError, match="clip_mode"):
        fastlib.train(mlp(), *data(), 1, 4, 0.1, "cross_entropy", clip_mode="l2", verbose=False)


# ---------------------------------------------------------------------------------------------
# train against the reference, batch by batch

def reflib_run(model_cfg, params, x, y, loss, opt_name, lr, orders, bs, hyper=None):
    """Run reflib.train_step over the given epoch orders; return the final parameters."""
    import reflib.models
    from reflib.train import train_step

    ref = reflib.models.from_config(model_cfg)
    ref.load_parameters(params)
    state = None
    for order in orders:
        for s in range(0, len(order), bs):
            idx = order[s:s + bs]
            _, _, new, state = train_step(ref, x[idx], y[idx], loss, opt_name, state, lr=lr,
                                          **(hyper or {}))
            ref.load_parameters(new)
    return ref.parameters()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("bs", [1, 4, 23])
def test_train_equals_reflib_steps_without_shuffle(fused, bs):
    x, y = data(n=10 if bs == 1 else 23)
    model = mlp()
    start = {k: v.copy() for k, v in model.parameters().items()}
    res = fastlib.train(model, x, y, 2, bs, 0.01, "cross_entropy", optimizer="Adam",
                        shuffle=False, fused=fused, **quiet())
    assert res.fused == fused
    order = np.arange(len(x))
    ref = reflib_run(model.get_config(), start, x, y, "cross_entropy", "Adam", 0.01,
                     [order, order], bs)  # the last incomplete batch included
    params_close(model.parameters(), ref)


@pytest.mark.parametrize("fused", [True, False])
def test_shuffle_draws_each_epoch_order_from_the_seed(fused):
    x, y = data()
    model = mlp(activation="tanh")
    start = {k: v.copy() for k, v in model.parameters().items()}
    fastlib.train(model, x, y, 2, 5, 0.05, "cross_entropy", optimizer="NAG", seed=11,
                  fused=fused, **quiet())
    rng = np.random.default_rng(11)  # documented: one permutation per epoch from the seed
    orders = [rng.permutation(len(x)) for _ in range(2)]
    ref = reflib_run(model.get_config(), start, x, y, "cross_entropy", "NAG", 0.05, orders, 5)
    params_close(model.parameters(), ref)


def test_same_seed_same_run_other_seed_other_run():
    x, y = data()
    runs = []
    for seed in (3, 3, 4):
        m = mlp()
        fastlib.train(m, x, y, 2, 4, 0.05, "cross_entropy", seed=seed, **quiet())
        runs.append(m.parameters()["0.weight"].copy())
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])


# ---------------------------------------------------------------------------------------------
# the fused MLP path equals the generic path

FUSED_CASES = (
    [("cross_entropy", name, "relu", 0.0, "value", 4) for name in optim.OPTIMIZERS] +
    [(loss, "adam", "tanh", 0.0, "value", 5) for loss in
     ("categorical_cross_entropy", "mse", "binary_cross_entropy_with_logits")] +
    [("cross_entropy", "sgd", act, 0.0, "value", 3) for act in
     ("sigmoid", "leaky_relu", "linear")] +
    [("mse", "momentum", "relu", 0.05, "value", 4), ("mse", "adamw", "relu", 0.3, "norm", 4),
     ("cross_entropy", "rmsprop", "relu", 0.0, "value", 1),
     # batch 1: weight gradients are outer products (fused_kernels._outer), not GEMMs
     ("mse", "adam", "relu", 0.05, "value", 1), ("cross_entropy", "sgd", "tanh", 0.0, "value", 1),
     ("cross_entropy", "nag", "relu", 0.0, "value", 1), ("mse", "adamw", "relu", 0.3, "norm", 1),
     ("cross_entropy", "adagrad", "relu", 0.0, "value", 23)])


@pytest.mark.parametrize("loss, opt_name, act, clip, mode, bs", FUSED_CASES)
def test_fused_path_equals_generic_path(loss, opt_name, act, clip, mode, bs):
    x, y = data()
    t = targets_for(loss, y)
    results, params = [], []
    for fused in (True, False):
        m = mlp(activation=act)
        r = fastlib.train(m, x, t, 3, bs, 0.02, loss, x, t, optimizer=opt_name,
                          gradient_clip=clip, clip_mode=mode, seed=2, fused=fused, **quiet())
        assert r.fused == fused
        results.append(r)
        params.append(m.parameters())
    params_close(params[0], params[1])
    np.testing.assert_allclose(results[0].loss_history, results[1].loss_history, rtol=1e-12)
    np.testing.assert_allclose(results[0].val_loss_history, results[1].val_loss_history,
                               rtol=1e-12)
    assert results[0].accuracy_history == results[1].accuracy_history


def test_fused_path_is_used_only_where_it_applies():
    x, y = data()
    assert fastlib.train(mlp(), x, y, 1, 4, 0.1, "cross_entropy", **quiet()).fused
    # every elementwise activation of the op table is fused; a softmax layer is not
    assert fastlib.train(mlp(activation="gelu"), x, y, 1, 4, 0.1, "cross_entropy",
                         **quiet()).fused
    probs_sm = fastlib.Sequential([fastlib.Dense(5, 3, "softmax")], dtype=np.float64)
    assert not fastlib.train(probs_sm, x, fastlib.onehot(y, 3), 1, 4, 0.1, "mse",
                             **quiet()).fused
    nested = fastlib.Sequential([fastlib.Sequential([fastlib.Dense(5, 4, "relu")]),
                                 fastlib.Dense(4, 3)], dtype=np.float64)
    # a nested chain compiles to the same Dense rows as a flat one: the mlp schedule runs it
    r = fastlib.train(nested, x, y, 1, 4, 0.1, "cross_entropy", **quiet())
    assert r.fused and (r.path, r.schedule) == ("program", "mlp")
    # binary_cross_entropy on probabilities is one of the compiled losses, and agrees with the
    # generic path to summation order (float64)
    runs = []
    for fused in (True, False):
        probs = fastlib.Sequential([fastlib.Dense(5, 2, "sigmoid")], dtype=np.float64, seed=1)
        yb = np.concatenate([y > 0, y > 1], axis=1).astype(np.float64)
        r = fastlib.train(probs, x, yb, 2, 4, 0.1, "binary_cross_entropy", fused=fused,
                          **quiet())
        assert r.fused == fused
        runs.append((r.loss_history, probs.parameters()))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-12)
    for k, v in runs[1][1].items():
        np.testing.assert_allclose(runs[0][1][k], v, rtol=1e-12, atol=1e-14)


def test_float32_training_runs_in_float32_and_learns():
    d = fastlib.datasets.load_digits()
    m = fastlib.Sequential([fastlib.Dense(64, 32, "relu"), fastlib.Dense(32, 10)],
                           dtype=np.float32, seed=0)
    r = fastlib.train(m, d.x_train, d.y_train, 4, 32, 3e-3, "cross_entropy", d.x_test, d.y_test,
                      "Adam", **quiet())
    assert r.fused and m.parameters()["0.weight"].dtype == np.float32
    assert r.loss_history[-1] < 0.5 * r.loss_history[0]
    assert r.val_accuracy_history[-1] > 0.9  # an 8x8-digits MLP passes 90% within a few epochs


# ---------------------------------------------------------------------------------------------
# the result, callbacks, progress

def test_result_fields_and_callbacks():
    x, y = data()
    seen = []

    class Recorder:
        def on_train_begin(self, logs):
            seen.append(("begin", logs["epochs"]))

        def on_epoch_end(self, epoch, logs):
            seen.append((epoch, sorted(logs)))

        def on_train_end(self, logs):
            seen.append(("end", logs["epochs_run"]))

    calls = []
    r = fastlib.train(mlp(), x, y, 3, 4, 0.05, "cross_entropy", x, y, "SGD",
                      callbacks=[Recorder(), lambda e, logs: calls.append(logs["lr"])],
                      **quiet())
    assert isinstance(r, TrainingResult)
    assert len(r.loss_history) == len(r.accuracy_history) == len(r.val_loss_history) == 3
    assert len(r.epoch_times) == 3 and r.total_time >= sum(r.epoch_times) > 0
    assert r.final_loss == r.loss_history[-1] and r.epochs_run == 3 and not r.stopped
    assert all(0.0 <= a <= 1.0 for a in r.accuracy_history)
    assert r.lr_history == [0.05] * 3 and calls == [0.05] * 3
    keys = sorted(["loss", "acc", "val_loss", "val_acc", "lr", "epoch_time"])
    assert seen == [("begin", 3), (1, keys), (2, keys), (3, keys), ("end", 3)]


def test_val_metrics_equal_direct_evaluation():
    from fastlib import losses

    x, y = data()
    m = mlp()
    r = fastlib.train(m, x, y, 2, 4, 0.05, "cross_entropy", x[:7], y[:7], **quiet())
    pred = m(x[:7])
    assert r.val_loss_history[-1] == pytest.approx(
        losses.loss_value("cross_entropy", pred, y[:7]), rel=1e-12)
    assert r.val_accuracy_history[-1] == losses.accuracy("cross_entropy", pred, y[:7])


def test_mse_has_no_accuracy():
    x, y = data()
    r = fastlib.train(mlp(), x, targets_for("mse", y), 2, 4, 0.05, "mse", **quiet())
    assert r.accuracy_history == [None, None]


def test_callback_can_stop_training():
    x, y = data()
    r = fastlib.train(mlp(), x, y, 10, 4, 0.05, "cross_entropy",
                      callbacks=[lambda e, logs: e == 2], **quiet())
    assert r.epochs_run == 2 and r.stopped and "callback" in r.stop_reason


def test_verbose_shows_a_progress_bar_and_quiet_is_silent(capsys):
    x, y = data()
    fastlib.train(mlp(), x, y, 2, 4, 0.05, "cross_entropy", verbose=True)
    err = capsys.readouterr().err
    assert "2/2" in err and "epoch" in err
    fastlib.train(mlp(), x, y, 2, 4, 0.05, "cross_entropy", verbose=False)
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


# ---------------------------------------------------------------------------------------------
# explosions

def overflow_case(dtype):
    """Dense(1, 1) with w x = 1, target -1e8: the loss (1 + 1e8)^2 is finite, but
    dL/dw = sum over the batch of 2 (w x - t) x / n = 2 (1 + 1e8) x overflows for x = 1e31
    (about 2e39 > float32's 3.4e38). Every value involved is a normal number."""
    m = fastlib.Sequential([fastlib.Dense(1, 1)], dtype=dtype)
    m.parameters()["0.weight"][...] = dtype(1e-31)
    m.parameters()["0.bias"][...] = 0.0
    x = np.full((4, 1), 1e31, dtype=dtype)
    return m, x, np.full((4, 1), -1e8, dtype=dtype)


@pytest.mark.parametrize("fused", [True, False])
def test_nonfinite_gradient_skips_the_step_and_warns(fused):
    m, x, y = overflow_case(np.float32)
    before = {k: v.copy() for k, v in m.parameters().items()}
    with pytest.warns(RuntimeWarning, match="skipped 2 optimizer step"):
        r = fastlib.train(m, x, y, 1, 2, 0.1, "mse", fused=fused, **quiet())
    assert r.skipped_steps == 2 and not r.diverged
    # (w x + 1e8)^2 with w x = 1 up to float32 roundings: within a few eps32 of (1 + 1e8)^2
    assert r.loss_history[0] == pytest.approx((1 + 1e8) ** 2, rel=8 * float(np.finfo(np.float32).eps))
    for k, v in m.parameters().items():
        assert np.array_equal(v, before[k])


@pytest.mark.parametrize("fused", [True, False])
def test_nonfinite_gradient_of_a_later_layer_skips_the_whole_step(fused):
    """Batch 1, two layers: the second weight's gradient h * dz = 1e31 * 2e8 overflows float32
    while the first layer's, x * dz * w2 = 2e-23, is finite. The fused path, which applies the
    update block by block, must still skip the step and change nothing."""
    m = fastlib.Sequential([fastlib.Dense(1, 1), fastlib.Dense(1, 1)], dtype=np.float32)
    p = m.parameters()
    p["0.weight"][...] = 1e31
    p["1.weight"][...] = 1e-31
    p["0.bias"][...] = p["1.bias"][...] = 0.0
    x = np.ones((2, 1), np.float32)
    y = np.full((2, 1), -1e8, np.float32)
    before = {k: v.copy() for k, v in p.items()}
    with pytest.warns(RuntimeWarning, match="skipped 2 optimizer step"):
        r = fastlib.train(m, x, y, 1, 1, 0.1, "mse", optimizer="Adam", fused=fused, divergence=False,
                          **quiet())
    assert r.fused == fused and r.skipped_steps == 2
    for k, v in m.parameters().items():
        assert np.array_equal(v, before[k])


@pytest.mark.parametrize("fused", [True, False])
def test_nonfinite_loss_stops_with_a_clear_message(fused):
    x, y = data()
    t = targets_for("mse", y) * 1e3
    with pytest.warns(RuntimeWarning, match="non-finite loss"):
        r = fastlib.train(mlp(), x, t, 50, 1, 10.0, "mse", optimizer="SGD", shuffle=False,
                          fused=fused, **quiet())
    assert r.diverged and r.stopped and r.epochs_run < 50
    assert "restored" in r.stop_reason and "lower the learning rate" in r.stop_reason
    # the stopped epoch is the histories' last entry, its non-finite loss recorded as inf; it
    # ran, so it counts, and the weights are those of the epoch before it
    assert r.restored_epoch == r.weights_epoch == r.epochs_run - 1 == len(r.loss_history) - 1
    assert all(np.isfinite(r.loss_history[:-1])) and r.loss_history[-1] == np.inf
    assert r.final_loss == r.loss_history[-1] == np.inf


@pytest.mark.parametrize("fused", [True, False])
def test_divergence_restores_the_weights_of_the_last_complete_epoch(fused):
    x, y = data()
    t = targets_for("mse", y) * 1e3
    kw = dict(optimizer="SGD", shuffle=False, fused=fused, **quiet())
    m = mlp()
    with pytest.warns(RuntimeWarning):
        r = fastlib.train(m, x, t, 50, 1, 10.0, "mse", **kw)
    assert r.diverged
    ref = mlp()
    if r.restored_epoch:
        fastlib.train(ref, x, t, r.restored_epoch, 1, 10.0, "mse", **kw)
    for k, v in ref.parameters().items():
        assert np.array_equal(m.parameters()[k], v), k


# ---------------------------------------------------------------------------------------------
# checkpoints

@pytest.mark.parametrize("fused", [True, False])
def test_resume_reproduces_an_uninterrupted_run_bit_for_bit(tmp_path, fused):
    x, y = data()
    kw = dict(optimizer="Adam", seed=5, fused=fused, **quiet())
    full = mlp()
    r_full = fastlib.train(full, x, y, 4, 3, 0.01, "cross_entropy", x, y, **kw)
    part = mlp()
    ck = tmp_path / "ck.npz"
    fastlib.train(part, x, y, 2, 3, 0.01, "cross_entropy", x, y, checkpoint=ck, **kw)
    resumed = mlp(seed=99)  # different initial weights: everything must come from the file
    r = fastlib.train(resumed, x, y, 4, 3, 0.01, "cross_entropy", x, y, resume=ck, **kw)
    for k, v in full.parameters().items():
        assert np.array_equal(resumed.parameters()[k], v), k
    assert r.loss_history == r_full.loss_history
    assert r.val_accuracy_history == r_full.val_accuracy_history and r.epochs_run == 4
    # the checkpoint is also a model file
    assert fastlib.load(ck).get_config() == full.get_config()


def test_checkpoint_every_and_resume_of_train_sh(tmp_path):
    x, y = data()
    # patience 1, min_delta 50%: epoch 1 is the best, epoch 2 reduces the rate, epoch 3 stops
    kw = dict(optimizer="SGD", monitor="loss", patience=1, min_delta=50.0, seed=1, **quiet())
    full = mlp()
    h_full = fastlib.train_sh(full, x, y, 6, 4, 0.05, "cross_entropy", **kw)
    assert h_full.lr == [0.05, 0.05, 0.025] and h_full.stopped_epoch == 3
    ck = tmp_path / "sh.npz"
    fastlib.train_sh(mlp(), x, y, 2, 4, 0.05, "cross_entropy", checkpoint=ck,
                     checkpoint_every=2, **kw)
    resumed = mlp(seed=7)
    h = fastlib.train_sh(resumed, x, y, 6, 4, 0.05, "cross_entropy", resume=ck, **kw)
    assert h.lr == h_full.lr and h.best_epoch == h_full.best_epoch == 1
    assert h.stopped_epoch == 3 and h.loss == h_full.loss and h.restored_best
    for k, v in full.parameters().items():
        assert np.array_equal(resumed.parameters()[k], v)
    # a checkpoint written when the policy stopped the run resumes to the same end, with a note
    ck2 = tmp_path / "stopped.npz"
    fastlib.train_sh(mlp(), x, y, 6, 4, 0.05, "cross_entropy", checkpoint=ck2, **kw)
    again = mlp(seed=8)
    with pytest.warns(RuntimeWarning, match="already stopped after epoch 3"):
        h2 = fastlib.train_sh(again, x, y, 6, 4, 0.05, "cross_entropy", resume=ck2, **kw)
    assert h2.stopped_epoch == 3 and h2.lr == h_full.lr
    for k, v in full.parameters().items():
        assert np.array_equal(again.parameters()[k], v)


def test_resume_errors_and_warnings(tmp_path):
    x, y = data()
    ck = tmp_path / "ck.npz"
    fastlib.train(mlp(), x, y, 1, 4, 0.05, "cross_entropy", optimizer="Adam", checkpoint=ck,
                  **quiet())
    # the message names where the models first differ, not two whole configs
    with pytest.raises(ValueError, match=r"model\.layers\[0\]\.out_features: .* saved, 7 "
                                         r"now\); build the same model"):
        fastlib.train(mlp(width=7), x, y, 2, 4, 0.05, "cross_entropy", optimizer="Adam",
                      resume=ck, **quiet())
    with pytest.raises(ValueError, match="trained with Adam"):
        fastlib.train(mlp(), x, y, 2, 4, 0.05, "cross_entropy", optimizer="SGD", resume=ck,
                      **quiet())
    with pytest.warns(RuntimeWarning, match="settings differ"):
        fastlib.train(mlp(), x, y, 2, 5, 0.05, "cross_entropy", optimizer="Adam", resume=ck,
                      **quiet())
    model_file = mlp().save(tmp_path / "model.npz")
    with pytest.raises(ValueError, match="verigrad-checkpoint"):
        fastlib.train(mlp(), x, y, 2, 4, 0.05, "cross_entropy", resume=model_file, **quiet())


# ---------------------------------------------------------------------------------------------
# train_sh

def test_train_sh_plateau_reduces_lr_stops_and_restores_best():
    x, y = data()
    # min_delta = 100%: no epoch after the first can improve a positive loss, so the policy
    # runs on a known plateau: reduce at epochs 1 + 2 and stop at 1 + 4 (2 x patience).
    m = mlp()
    h = fastlib.train_sh(m, x, y, 20, 4, 0.05, "cross_entropy", "SGD", monitor="loss",
                         patience=2, min_delta=100.0, restore_best=True, seed=3, **quiet())
    assert isinstance(h, TrainingHistorySH)
    assert h.lr == [0.05, 0.05, 0.05, 0.025, 0.025]
    assert h.best_epoch == 1 and h.best_metric == h.loss[0] and h.stopped_epoch == 5
    assert h.lr_reductions == 1 and "stop_patience=4" in h.stop_reason and h.restored_best
    one = mlp()
    fastlib.train(one, x, y, 1, 4, 0.05, "cross_entropy", optimizer="SGD", seed=3, **quiet())
    for k, v in one.parameters().items():
        assert np.array_equal(m.parameters()[k], v), k


def test_train_sh_monitors_validation_and_checks_it_exists():
    x, y = data()
    h = fastlib.train_sh(mlp(), x, y, 3, 4, 0.05, "cross_entropy", "Adam", "val_acc", 5, 1.0,
                         False, x, y, **quiet())
    assert len(h.val_acc) == 3 and h.best_metric == max(h.val_acc)
    with pytest.raises(ValueError, match="needs validation data"):
        fastlib.train_sh(mlp(), x, y, 3, 4, 0.05, "cross_entropy", monitor="val_loss",
                         **quiet())
    with pytest.raises(ValueError, match="has no accuracy"):
        fastlib.train_sh(mlp(), x, targets_for("mse", y), 3, 4, 0.05, "mse", monitor="acc",
                         **quiet())


# ---------------------------------------------------------------------------------------------
# bad input

@pytest.mark.parametrize("change, err, words", [
    ({"y": np.zeros((5, 1), np.int64)}, ValueError, "same number of rows"),
    ({"y": "onehot"}, ValueError, "use categorical_cross_entropy"),
    ({"y": np.full((23, 1), 7)}, ValueError, "out of range"),
    ({"x": "nan"}, ValueError, "NaN"),
    ({"x": np.zeros((23, 4))}, ValueError, "last axis"),
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
    ({"batch_size": 2.5}, TypeError, "batch_size must be an int"),
    ({"epochs": -1}, ValueError, "epochs must be >= 0"),
    ({"learning_rate": -0.1}, ValueError, "learning_rate"),
    ({"loss_type": "crossentropy"}, ValueError, "cross_entropy"),
    ({"optimizer": "adamw2"}, ValueError, "AdamW"),
    ({"algorithm": "bpp"}, ValueError, "'bp'"),
    ({"device": "tpu"}, ValueError, "'cpu' or 'cuda'"),
    ({"x_val": np.zeros((2, 5))}, ValueError, "x_val was given without y_val"),
    ({"gradient_clip": -1.0}, ValueError, "gradient_clip"),
    ({"fusd": False}, TypeError, "unexpected option(s) ['fusd']"),
])
def test_bad_arguments_get_clear_errors(change, err, words):
    x, y = data()
    args = dict(model=mlp(), x=x, y=y, epochs=1, batch_size=4, learning_rate=0.1,
                loss_type="cross_entropy")
    args.update(change)
    if isinstance(args["y"], str):
        args["y"] = fastlib.onehot(y, 3)
    if isinstance(args["x"], str):
        args["x"] = x.copy()
        args["x"][3, 2] = np.nan
    with pytest.raises(err) as info:
        fastlib.train(verbose=False, **args)
    assert words in str(info.value), str(info.value)


def test_cuda_without_gpu_is_a_clear_error():
    from fastlib.cuda import device

    if device.is_available():
        pytest.skip("a CUDA device (or the simulator) is present: the no-GPU error cannot occur")
    x, y = data()
    with pytest.raises(RuntimeError, match="device='cuda' is not available"):
        fastlib.train(mlp(), x, y, 1, 4, 0.1, "cross_entropy", device="cuda", verbose=False)


def test_batch_larger_than_data_is_one_full_batch():
    x, y = data()
    a, b = mlp(), mlp()
    fastlib.train(a, x, y, 2, 100, 0.1, "cross_entropy", **quiet())
    fastlib.train(b, x, y, 2, 23, 0.1, "cross_entropy", **quiet())
    for k in a.parameters():
        assert np.array_equal(a.parameters()[k], b.parameters()[k])


def test_sparse_alias_warns_and_trains():
    x, y = data()
    with pytest.warns(DeprecationWarning, match="cross_entropy"):
        r = fastlib.train(mlp(), x, y, 1, 4, 0.1, "sparse_cross_entropy", **quiet())
    assert len(r.loss_history) == 1


# ---------------------------------------------------------------------------------------------
# algorithms are pluggable

def test_register_a_custom_algorithm_and_train_with_it():
    def sign_sgd(ctx, xb, yb):
        """signSGD: w -= lr * sign(grad), through the context's pieces."""
        from fastlib import losses

        pred = ctx.model.forward(xb)
        loss, dpred = losses.loss_value_and_grad(ctx.loss_type, pred, yb, check=False)
        _, grads = ctx.model.backward(dpred, need_input_grad=False)
        for k, p in ctx.params.items():
            p -= ctx.lr * np.sign(grads[k])
        return algorithms.BatchResult(loss, None, False)

    register_algorithm("sign_sgd_test", sign_sgd, overwrite=True)
    x, y = data()
    m = mlp()
    start = {k: v.copy() for k, v in m.parameters().items()}
    r = fastlib.train(m, x, y, 1, 23, 0.01, "cross_entropy", algorithm="Sign_SGD_test",
                      **quiet())
    assert not r.fused and r.accuracy_history == [None]
    # one full-batch step: every parameter moved by exactly lr (or 0 where the gradient is 0)
    for k, v in m.parameters().items():
        moved = np.abs(v - start[k])
        assert np.all((np.abs(moved - 0.01) < 1e-15) | (moved == 0)), k
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("sign_sgd_test", sign_sgd)
    with pytest.raises(TypeError, match="callable"):
        register_algorithm("nope", 3)


def test_unsupervised_algorithm_trains_without_targets():
    counted = []

    def count_only(ctx, xb, yb):
        assert yb is None
        counted.append(len(xb))
        ctx.state["seen"] = ctx.state.get("seen", 0) + len(xb)
        return algorithms.BatchResult(0.0, None, False)

    register_algorithm("count_only_test", count_only, needs_targets=False, overwrite=True)
    x, _ = data()
    r = fastlib.train(mlp(), x, None, 2, 10, 0.1, None, algorithm="count_only_test", **quiet())
    assert counted == [10, 10, 3, 10, 10, 3] and r.loss_history == [0.0, 0.0]


def test_algorithm_hooks_init_evaluate_and_state_survive_a_checkpoint(tmp_path):
    def init(ctx):
        ctx.state["batches"] = np.zeros(1)
        ctx.state["label"] = "counter"

    def one_batch(ctx, xb, yb):
        ctx.state["batches"] += 1
        return algorithms.BatchResult(float(ctx.state["batches"][0]), None, False)

    def evaluate(model, x, y, loss_type):
        return float(len(x)), 0.5

    register_algorithm("counter_test", one_batch, init=init, evaluate=evaluate, overwrite=True)
    x, y = data()
    ck = tmp_path / "c.npz"
    kw = dict(algorithm="counter_test", **quiet())
    r = fastlib.train(mlp(), x, y, 2, 10, 0.1, "cross_entropy", x[:4], y[:4],
                      checkpoint=ck, **kw)
    # 3 batches per epoch (10, 10, 3); the epoch loss is the sample-weighted batch mean
    assert r.loss_history == [(1 * 10 + 2 * 10 + 3 * 3) / 23, (4 * 10 + 5 * 10 + 6 * 3) / 23]
    assert r.val_loss_history == [4.0, 4.0] and r.val_accuracy_history == [0.5, 0.5]
    r = fastlib.train(mlp(), x, y, 3, 10, 0.1, "cross_entropy", x[:4], y[:4], resume=ck, **kw)
    assert r.loss_history[-1] == (7 * 10 + 8 * 10 + 9 * 3) / 23  # the count went on from 6


def test_float_targets_of_a_token_model_are_kept_in_the_models_dtype():
    """Integer inputs (token ids) do not decide the targets' dtype: a float32 model's float
    targets stay float32 (exact, no float64 copy of twice the size)."""
    from fastlib.training import algorithms, run_data

    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, (12, 3))
    y = rng.uniform(0.2, 0.8, (12, 3, 2)).astype(np.float32)
    model = fastlib.Sequential([fastlib.Embedding(5, 4), fastlib.Dense(4, 2)],
                               dtype=np.float32, seed=0)
    data = run_data.check_data(model, algorithms.get_algorithm("bp"), "mse", x, y, x[:4], y[:4])
    for got, want in ((data.y, y), (data.y_val, y[:4])):
        assert got.dtype == np.float32 and np.array_equal(got, want)
