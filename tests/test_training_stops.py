"""After any way a run ends, ``TrainingResult`` agrees with its histories, the callbacks heard
every epoch that ran, and the model holds the weights of ``weights_epoch``.

The witness for the weights is independent of the result: a callback copies the model's
parameters at the end of every epoch (and they are copied before the first), so the weights the
model holds on return are compared with what the model held at the end of the epoch the result
names. The stop kinds: every epoch ran, a callback, early stopping (no improvement, and the rate
below min_lr), a divergence rule after the first epoch and after a later one, a non-finite loss
part-way through the first epoch, a resume with nothing left to train, and no epochs at all.
Also: progress only on a terminal, the options object, the keyword guesses, the public errors.
"""
from __future__ import annotations

import io
import math
import sys
import warnings

import numpy as np
import pytest

import fastlib
from fastlib.training import TrainOptions


def small_mlp(dtype=np.float64):
    return fastlib.Sequential([fastlib.Dense(5, 6, "relu"), fastlib.Dense(6, 3)], dtype=dtype,
                              seed=0)


def small_data(n=23):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 5)), rng.integers(0, 3, size=(n, 1))


@pytest.fixture(scope="module")
def digits():
    from fastlib.datasets import load_digits

    return load_digits()


def digits_mlp():
    return fastlib.Sequential([fastlib.Dense(64, 128, "relu"), fastlib.Dense(128, 10)],
                              dtype=np.float32, seed=0)


class Witness:
    """A callback that copies the weights after every epoch and keeps every epoch's logs."""

    def __init__(self, model, stop_at=None):
        self.model, self.stop_at = model, stop_at
        self.weights = {0: self._copy()}
        self.logs = []

    def _copy(self):
        return {k: v.copy() for k, v in self.model.parameters().items()}

    def on_epoch_end(self, epoch, logs):
        self.weights[epoch] = self._copy()
        self.logs.append((epoch, dict(logs)))
        return epoch == self.stop_at


def same(a, b):
    """Equal, NaN equal to NaN (a not-evaluated validation entry)."""
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_agrees(r, witness, validated, first_epoch=1):
    """The rules of TrainingResult's docstring, checked on ``r``."""
    n = r.epochs_run
    assert n == len(r.loss_history) == len(r.accuracy_history) == len(r.lr_history) \
        == len(r.epoch_times)
    assert len(r.val_loss_history) == len(r.val_accuracy_history) == (n if validated else 0)
    if n:
        assert r.final_loss == r.loss_history[-1]
    else:
        assert math.isnan(r.final_loss)
    assert r.stopped == (r.stop_reason is not None)
    if r.diverged:
        assert r.weights_epoch == r.restored_epoch < r.epochs_run
    # the callbacks heard every epoch that ran, with the figures the histories hold
    assert [e for e, _ in witness.logs] == list(range(first_epoch, n + 1))
    for epoch, logs in witness.logs:
        i = epoch - 1
        assert same(logs["loss"], r.loss_history[i]) and same(logs["acc"], r.accuracy_history[i])
        assert logs["lr"] == r.lr_history[i] and logs["epoch_time"] == r.epoch_times[i]
        if validated:
            assert same(logs["val_loss"], r.val_loss_history[i])
            assert same(logs["val_acc"], r.val_accuracy_history[i])
    # the model holds the weights it held at the end of weights_epoch (0: before training)
    for k, v in witness.model.parameters().items():
        assert np.array_equal(v, witness.weights[r.weights_epoch][k]), k


# ---------------------------------------------------------------------------------------------
# every stop kind

def test_a_run_of_every_epoch():
    x, y = small_data()
    model = small_mlp()
    w = Witness(model)
    r = fastlib.train(model, x, y, 3, 4, 0.05, "cross_entropy", x, y, callbacks=[w],
                      verbose=False)
    assert_agrees(r, w, validated=True)
    assert r.epochs_run == r.weights_epoch == 3 and not r.stopped


def test_a_callback_stop():
    x, y = small_data()
    model = small_mlp()
    w = Witness(model, stop_at=2)
    r = fastlib.train(model, x, y, 10, 4, 0.05, "cross_entropy", callbacks=[w], verbose=False)
    assert_agrees(r, w, validated=False)
    assert r.epochs_run == r.weights_epoch == 2 and "callback Witness" in r.stop_reason


def test_early_stopping_restores_the_best_epoch():
    x, y = small_data()
    model = small_mlp()
    w = Witness(model)
    # min_delta 1000%: nothing after the first epoch improves, so the policy stops after
    # stop_patience = 2 epochs without improvement, at epoch 3, and puts epoch 1 back
    h = fastlib.train_sh(model, x, y, 10, 4, 0.05, "cross_entropy", monitor="loss", patience=1,
                         min_delta=1000.0, restore_best=True, callbacks=[w], verbose=False,
                         options=TrainOptions(lr_factor=1.0))
    r = h.result
    assert_agrees(r, w, validated=False)
    assert h.stopped_epoch == r.epochs_run == 3 and h.best_epoch == r.weights_epoch == 1
    assert h.restored_best and "stop_patience=2" in h.stop_reason


def test_early_stopping_when_the_rate_falls_below_min_lr():
    x, y = small_data()
    model = small_mlp()
    w = Witness(model)
    # patience 1, factor 0.1: the rate 0.05 becomes 0.005 < min_lr = 0.01 after epoch 2
    h = fastlib.train_sh(model, x, y, 10, 4, 0.05, "cross_entropy", monitor="loss", patience=1,
                         min_delta=1000.0, restore_best=False, callbacks=[w], verbose=False,
                         lr_factor=0.1, stop_patience=5, min_lr=0.01)
    r = h.result
    assert_agrees(r, w, validated=False)
    assert r.epochs_run == r.weights_epoch == 2 and "min_lr" in r.stop_reason
    assert r.lr_history == [0.05, 0.05] and h.lr_reductions == 1


@pytest.mark.parametrize("fused", [True, False])
def test_a_divergence_after_the_first_epoch(digits, fused):
    model = digits_mlp()
    w = Witness(model)
    with pytest.warns(fastlib.DivergenceWarning, match="divergence rule"):
        r = fastlib.train(model, digits.x_train, digits.y_train, 5, 32, 1e3, "cross_entropy",
                          digits.x_test, digits.y_test, "SGD", fused=fused, callbacks=[w],
                          verbose=False)
    assert_agrees(r, w, validated=True)
    assert r.diverged and r.epochs_run == 1 and r.weights_epoch == 0
    # its figures are the epoch's own: the loss that tripped the rule, validation not evaluated
    assert r.loss_history[0] > 1e5 and 0 <= r.accuracy_history[0] <= 1
    assert math.isnan(r.val_loss_history[0]) and math.isnan(r.val_accuracy_history[0])


@pytest.mark.parametrize("fused", [True, False])
def test_a_divergence_at_a_later_epoch_keeps_the_checkpoint_of_the_last_good_one(
        digits, fused, tmp_path):
    from fastlib.training.checkpoint import load_checkpoint

    model = digits_mlp()
    w = Witness(model)
    ck = tmp_path / "ck.npz"
    # a healthy run's weights start below 0.7 and grow: 0.75 is crossed after a later epoch
    rules = {"max_loss": None, "loss_growth": None, "max_grad": None, "max_weight": 0.75}
    with pytest.warns(fastlib.DivergenceWarning, match="max_weight"):
        r = fastlib.train(model, digits.x_train, digits.y_train, 20, 32, 1e-3, "cross_entropy",
                          optimizer="Adam", fused=fused, divergence=rules, checkpoint=ck,
                          callbacks=[w], verbose=False)
    assert_agrees(r, w, validated=False)
    assert r.diverged and r.epochs_run >= 2 and r.weights_epoch == r.epochs_run - 1
    saved = load_checkpoint(ck)     # written after the last good epoch, never after the bad one
    assert saved.epoch == r.weights_epoch and len(saved.history["loss"]) == saved.epoch
    for k, v in model.parameters().items():
        assert np.array_equal(saved.params[k], v), k
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz"]   # no lock, no temporaries


@pytest.mark.parametrize("fused", [True, False])
def test_a_non_finite_loss_part_way_through_the_first_epoch(fused):
    # Dense(1, 1), w = 1, b = 0, x = 1, target 0, SGD at rate 10, one sample per batch: the
    # output s = w + b becomes s - 2 * 10 * (s + s) = -39 s each step, the loss s^2 grows by
    # 39^2; a float32 run's loss is a float32 number, and 39^24 = 1.6e38 is finite while
    # 39^26 overflows, so batch 14 (s = 39^13) has an infinite loss and the epoch stops there,
    # 26 of its 40 batches untrained
    model = fastlib.Sequential([fastlib.Dense(1, 1)], dtype=np.float32)
    model.parameters()["0.weight"][...] = 1.0
    model.parameters()["0.bias"][...] = 0.0
    x, t = np.ones((40, 1), np.float32), np.zeros((40, 1), np.float32)
    w = Witness(model)
    with pytest.warns(fastlib.DivergenceWarning, match="non-finite loss") as record:
        r = fastlib.train(model, x, t, 3, 1, 10.0, "mse", optimizer="SGD", shuffle=False,
                          fused=fused, callbacks=[w], verbose=False)
    assert len(record) == 1 and "batch 14" in r.stop_reason
    assert_agrees(r, w, validated=False)
    assert r.divergence_rule == "non_finite_loss" and r.epochs_run == 1 and r.weights_epoch == 0
    assert r.loss_history == [math.inf] and r.accuracy_history == [None]


def test_a_resume_with_nothing_left_to_train(tmp_path):
    x, y = small_data()
    ck = tmp_path / "ck.npz"
    first = fastlib.train(small_mlp(), x, y, 2, 4, 0.05, "cross_entropy", x, y, checkpoint=ck,
                          verbose=False)
    model = small_mlp()
    w = Witness(model)
    with pytest.warns(RuntimeWarning, match="nothing to train"):
        r = fastlib.train(model, x, y, 2, 4, 0.05, "cross_entropy", x, y, resume=ck,
                          callbacks=[w], verbose=False)
    w.weights[2] = {k: v.copy() for k, v in model.parameters().items()}   # the checkpoint's
    assert_agrees(r, w, validated=True, first_epoch=3)
    assert r.loss_history == first.loss_history and r.epochs_run == r.weights_epoch == 2


def test_no_epochs():
    x, y = small_data()
    model = small_mlp()
    w = Witness(model)
    r = fastlib.train(model, x, y, 0, 4, 0.05, "cross_entropy", callbacks=[w], verbose=False)
    assert_agrees(r, w, validated=False)
    assert r.epochs_run == r.weights_epoch == 0 and r.loss_history == []


def test_train_sh_diverging_in_its_first_epoch_has_no_best(digits):
    with pytest.warns(fastlib.DivergenceWarning):
        h = fastlib.train_sh(digits_mlp(), digits.x_train, digits.y_train, 5, 32, 1e3,
                             "cross_entropy", "SGD", "loss", verbose=False)
    assert h.best_metric is None and h.best_epoch == 0 and not h.restored_best
    assert h.stopped_epoch == h.result.epochs_run == 1 and h.result.weights_epoch == 0


# ---------------------------------------------------------------------------------------------
# progress: a bar where someone watches, plain lines in a log

class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream, verbose, bar", [
    (_Terminal, True, True), (io.StringIO, True, False), (_Terminal, 2, False),
])
def test_progress_is_a_bar_only_on_a_terminal(monkeypatch, stream, verbose, bar):
    x, y = small_data()
    err = stream()
    monkeypatch.setattr(sys, "stderr", err)
    fastlib.train(small_mlp(), x, y, 3, 4, 0.05, "cross_entropy", verbose=verbose)
    text = err.getvalue()
    assert ("\r" in text) == bar
    if not bar:
        lines = text.splitlines()
        assert len(lines) == 3 and all(f"epoch {k}/3" in line for k, line in enumerate(lines, 1))


def test_a_bad_verbose_is_refused_before_training():
    x, y = small_data()
    with pytest.raises(ValueError, match="verbose must be"):
        fastlib.train(small_mlp(), x, y, 3, 4, 0.05, "cross_entropy", verbose="loud")


# ---------------------------------------------------------------------------------------------
# the options object, the keyword guesses, the public errors

def test_the_options_object_trains_exactly_like_the_keywords():
    x, y = small_data()
    a, b = small_mlp(), small_mlp()
    ra = fastlib.train(a, x, y, 3, 4, 0.5, "cross_entropy", gradient_clip=0.1, clip_mode="norm",
                       shuffle=False, verbose=False)
    rb = fastlib.train(b, x, y, 3, 4, 0.5, "cross_entropy", verbose=False,
                       options=TrainOptions(gradient_clip=0.1, clip_mode="norm", shuffle=False))
    assert ra.loss_history == rb.loss_history
    for k, v in a.parameters().items():
        assert np.array_equal(v, b.parameters()[k])


@pytest.mark.parametrize("fn, kwargs, words", [
    ("train", {"epoch": 3}, "did you mean 'epochs'?"),
    ("train", {"batchsize": 4}, "did you mean 'batch_size'?"),
    ("train", {"gradient_clp": 1.0}, "did you mean 'gradient_clip'?"),
    ("train", {"verbos": False}, "did you mean 'verbose'?"),
    ("train", {"fusd": False}, "did you mean 'fused'?"),
    ("train_sh", {"patiense": 3}, "did you mean 'patience'?"),
    ("train_sh", {"lr_factr": 0.3}, "did you mean 'lr_factor'?"),
    ("train", {"lr_factor": 0.3}, "train_sh's plateau policy"),
    ("train", {"shuffle": False, "options": TrainOptions()}, "not both"),
    ("train", {"options": {"shuffle": False}}, "must be a fastlib.TrainOptions"),
])
def test_a_misspelt_or_misplaced_keyword_is_named(fn, kwargs, words):
    x, y = small_data()
    # the misspelt keyword stands in for the right one (so, e.g., epochs is not given)
    args = {k: v for k, v in dict(epochs=1, batch_size=4, verbose=False).items()
            if not any(k.startswith(given[:5]) for given in kwargs)}
    with pytest.raises(TypeError) as info:
        getattr(fastlib, fn)(small_mlp(), x, y, lr=0.1, loss="cross_entropy", **args, **kwargs)
    assert words in str(info.value), str(info.value)


def test_a_custom_algorithm_still_receives_its_own_options():
    from fastlib.training import register_algorithm
    from fastlib.training.backprop import bp_train_one_batch

    seen = {}

    def step(ctx, xb, yb):
        seen.update(ctx.config.extra)
        return bp_train_one_batch(ctx, xb, yb)

    register_algorithm("anything_goes", step, overwrite=True)   # options=None: takes any
    x, y = small_data()
    fastlib.train(small_mlp(), x, y, 1, 4, 0.1, "cross_entropy", algorithm="anything_goes",
                  temperature=2.0, verbose=False)
    assert seen == {"temperature": 2.0}
    with pytest.raises(TypeError, match="did you mean 'epochs'"):   # but not a near-miss
        fastlib.train(small_mlp(), x, y, batch_size=4, lr=0.1, loss="cross_entropy",
                      algorithm="anything_goes", epoch=1, verbose=False)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"gradient_clip": -1.0}, ValueError, "gradient_clip"),
    ({"clip_mode": "l2"}, ValueError, "clip_mode"),
    ({"checkpoint_every": 0}, ValueError, "checkpoint_every must be >= 1"),
    ({"resume_mismatch": "ignore"}, ValueError, "resume_mismatch"),
    ({"divergence": {"max_los": 1.0}}, ValueError, "unknown rule"),
    ({"distributed": "yes"}, TypeError, "distributed must be"),
    ({"lr_factor": 2.0}, ValueError, "lr_factor"),
    ({"stop_patience": 0}, ValueError, "stop_patience"),
])
def test_options_are_checked_when_built(kwargs, error, words):
    with pytest.raises(error, match=words):
        TrainOptions(**kwargs)


def test_the_public_errors_come_from_fastlib(tmp_path):
    from fastlib import errors

    for name in ("CorruptFileError", "CheckpointLockedError", "DivergenceWarning"):
        assert getattr(fastlib, name) is getattr(errors, name) and name in fastlib.__all__
    bad = tmp_path / "m.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(fastlib.CorruptFileError, match="m.npz"):
        fastlib.load(bad)
    assert issubclass(fastlib.DivergenceWarning, RuntimeWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastlib.DivergenceWarning)
        with pytest.raises(fastlib.DivergenceWarning):
            model = fastlib.Sequential([fastlib.Dense(1, 1)], dtype=np.float32)
            fastlib.train(model, np.ones((40, 1), np.float32) * 1e6,
                          np.zeros((40, 1), np.float32), 1, 1, 1e6, "mse", verbose=False)


def test_datacodes_positional_order_is_kept():
    import inspect

    order = ["model", "x", "y", "epochs", "batch_size", "learning_rate", "loss_type"]
    train = list(inspect.signature(fastlib.train).parameters)
    train_sh = list(inspect.signature(fastlib.train_sh).parameters)
    assert train[:10] == order + ["x_val", "y_val", "optimizer"]
    assert train_sh[:14] == order + ["optimizer", "monitor", "patience", "min_delta",
                                     "restore_best", "x_val", "y_val"]


# every keyword the two functions took before their rarely used options were grouped
EARLIER_KEYWORDS = {"lr": 0.1, "loss": "cross_entropy", "validation_data": None,
                    "gradient_clip": 0.0, "clip_mode": "value", "shuffle": True, "seed": 0,
                    "device": "cpu", "algorithm": "bp", "callbacks": (), "verbose": False,
                    "checkpoint": None, "checkpoint_every": 1, "resume": None,
                    "resume_mismatch": "warn", "divergence": None, "distributed": False,
                    "fused": True, "pieces": None}
EARLIER_TRAIN_SH = {"monitor": "loss", "patience": 10, "min_delta": 1.0, "restore_best": True,
                    "lr_factor": 0.5, "stop_patience": None, "min_lr": 1e-6}


@pytest.mark.parametrize("fn", ["train", "train_sh"])
def test_every_earlier_keyword_still_works(fn):
    x, y = small_data()
    extra = EARLIER_TRAIN_SH if fn == "train_sh" else {}
    a, b = small_mlp(), small_mlp()
    given = getattr(fastlib, fn)(a, x, y, epochs=2, batch_size=4, **EARLIER_KEYWORDS, **extra)
    plain = getattr(fastlib, fn)(b, x, y, 2, 4, 0.1, "cross_entropy", verbose=False,
                                 **({"monitor": "loss"} if extra else {}))
    given, plain = getattr(given, "result", given), getattr(plain, "result", plain)
    assert given.loss_history == plain.loss_history and given.epochs_run == 2
