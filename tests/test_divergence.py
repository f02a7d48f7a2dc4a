"""Divergence caught while the loss is finite: the rules, the runs that must stop (with the rule
named and the last good weights back) and the healthy runs that must not."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import fastlib
from fastlib.training.early_stopping import DivergenceRules, check_divergence


# ---------------------------------------------------------------------------------------------
# the rules on constructed numbers

RULES = DivergenceRules()


@pytest.mark.parametrize("args, rule", [
    # (loss, best, initial, max weight, max grad) -> the rule that fires, or None
    ((2.0, 0.5, 2.3, 1.0, 1.0), None),                    # healthy
    ((1.1e8, 2.0, 2.3, 1.0, 1.0), "max_loss"),
    ((231.0, 2.0, 2.3, 1.0, 1.0), "loss_growth"),         # > 100 x best and > untrained
    ((199.0, 2.0, 2.3, 1.0, 1.0), None),                  # 99.5 x best
    ((0.2, 0.001, 2.3, 1.0, 1.0), None),                  # 200 x best but below untrained
    ((500.0, 2.0, None, 1.0, 1.0), None),                 # no untrained loss measured
    ((2.0, 0.5, 2.3, 1.1e6, 1.0), "max_weight"),
    ((2.0, 0.5, 2.3, math.inf, 1.0), "max_weight"),        # a NaN / Inf weight
    ((2.0, 0.5, 2.3, 1.0, 1.1e8), "max_grad"),
    ((2.0, 0.5, 2.3, 1.0, None), None),                   # no gradient (cd)
])
def test_each_rule_fires_exactly_beyond_its_threshold(args, rule):
    fired = check_divergence(RULES, *args)
    assert (fired and fired[0]) == rule or (fired is None and rule is None)
    if rule:
        assert rule in fired[1]


def test_mse_thresholds_scale_with_the_targets():
    # targets of RMS 1e5: a loss of 1e12 is an RMS error of 1e6, ten times the targets
    assert check_divergence(RULES, 1e12, None, None, 1.0, 1e12, target_scale=1e5) is None
    assert check_divergence(RULES, 1.1e18, None, None, 1.0, 1.0, target_scale=1e5)[0] == \
        "max_loss"
    assert check_divergence(RULES, 1.0, None, None, 1.0, 1.1e13, target_scale=1e5)[0] == \
        "max_grad"


def test_rules_are_validated_and_can_be_turned_off():
    assert DivergenceRules.from_option(False) is None
    assert DivergenceRules.from_option(None) == DivergenceRules()
    assert DivergenceRules.from_option({"max_loss": None}).max_loss is None
    with pytest.raises(ValueError, match="unknown rule"):
        DivergenceRules.from_option({"max_los": 1.0})
    with pytest.raises(ValueError, match="finite number > 0"):
        DivergenceRules(max_weight=-1.0)
    with pytest.raises(ValueError, match="factor > 1"):
        DivergenceRules(loss_growth=0.5)
    with pytest.raises(TypeError, match="divergence must be"):
        DivergenceRules.from_option("yes")
    assert check_divergence(DivergenceRules(None, None, None, None), 1e300, 1.0, 1.0, 1e300,
                            1e300) is None


# ---------------------------------------------------------------------------------------------
# runs that blow up with a finite loss

@pytest.fixture(scope="module")
def digits():
    from fastlib.datasets import load_digits

    return load_digits()


def _model():
    return fastlib.Sequential([fastlib.Dense(64, 128, "relu"), fastlib.Dense(128, 10)],
                              dtype=np.float32, seed=0)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("optimizer, lr", [("SGD", 1e3), ("SGD", 1e6), ("Adam", 1e4),
                                           ("Momentum", 1e3)])
def test_exploding_runs_stop_with_the_rule_named_and_the_weights_restored(digits, fused,
                                                                        optimizer, lr):
    model = _model()
    with pytest.warns(RuntimeWarning, match="divergence rule") as record:
        r = fastlib.train(model, digits.x_train, digits.y_train, 30, 32, lr, "cross_entropy",
                          optimizer=optimizer, fused=fused, verbose=False)
    assert r.diverged and r.stopped and r.fused == fused
    assert r.divergence_rule in ("max_loss", "loss_growth")
    assert f"'{r.divergence_rule}'" in r.stop_reason and "restored" in r.stop_reason
    assert r.stop_reason in str(record[0].message)
    # stopped after the first epoch (its loss is 6.8e5 or more), the initial weights put back;
    # the stopped epoch is an epoch that ran: the histories and the counts say so alike
    assert r.restored_epoch == r.weights_epoch == 0 and r.epochs_run == 1
    assert len(r.loss_history) == len(r.accuracy_history) == len(r.lr_history) == 1
    assert r.loss_history[-1] >= 6.8e5 or not np.isfinite(r.loss_history[-1])
    assert r.lr_history == [lr] and r.final_loss == r.loss_history[-1]
    for k, v in _model().parameters().items():
        assert np.array_equal(model.parameters()[k], v), k


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("rules, rule", [
    ({"max_loss": None}, "loss_growth"),
    ({"max_loss": None, "loss_growth": None}, "max_weight"),
])
def test_every_rule_stops_the_run_on_its_own(digits, fused, rules, rule):
    with pytest.warns(RuntimeWarning, match=rule):
        r = fastlib.train(_model(), digits.x_train, digits.y_train, 5, 32, 1e3, "cross_entropy",
                          optimizer="SGD", fused=fused, verbose=False, divergence=rules)
    assert r.divergence_rule == rule


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("rule", ["max_weight", "max_grad", "max_loss"])
def test_thresholds_below_a_healthy_run_fire_after_the_epoch_that_crosses_them(digits, fused,
                                                                              rule):
    # a healthy run: weights start below 0.7 and grow, probe gradients are about 0.05, the loss
    # falls from 2.6; thresholds inside those ranges fire after a later epoch, and the weights
    # of the epoch before are the ones put back
    limit = {"max_weight": 0.75, "max_grad": 1e-3, "max_loss": 1.0}[rule]
    rules = {name: None for name in DivergenceRules.RULES} | {rule: limit}
    model = _model()
    with pytest.warns(RuntimeWarning, match=rule):
        r = fastlib.train(model, digits.x_train, digits.y_train, 20, 32, 1e-3, "cross_entropy",
                          optimizer="Adam", fused=fused, verbose=False, divergence=rules)
    assert r.divergence_rule == rule
    assert r.restored_epoch == r.weights_epoch == r.epochs_run - 1 == len(r.loss_history) - 1
    ref = _model()
    if r.restored_epoch:
        fastlib.train(ref, digits.x_train, digits.y_train, r.restored_epoch, 32, 1e-3,
                      "cross_entropy", optimizer="Adam", fused=fused, verbose=False,
                      divergence=False)
    for k, v in ref.parameters().items():
        assert np.array_equal(model.parameters()[k], v), k


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("side, fires", [(0.999, True), (1.001, False)])
def test_max_grad_reads_the_gradient_of_the_epochs_last_step(digits, fused, side, fires):
    # one step per epoch (the batch is the whole set): the last step's gradient is the loss
    # gradient at the initial weights over every sample, computed here on the layers' path;
    # a threshold a tenth of a percent under its largest entry fires, one over it does not
    # (the summation orders differ by float32 roundings, far below 1e-3)
    from fastlib.grad import value_and_grad

    x, y = digits.x_train, digits.y_train
    _, grads = value_and_grad(_model(), x, y, "cross_entropy")
    largest = max(float(np.max(np.abs(g))) for g in grads.values())
    rules = {name: None for name in DivergenceRules.RULES} | {"max_grad": side * largest}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = fastlib.train(_model(), x, y, 1, len(x), 0.1, "cross_entropy", optimizer="SGD",
                          fused=fused, verbose=False, divergence=rules)
    assert r.fused == fused
    assert r.diverged == fires and (r.divergence_rule == "max_grad") == fires
    assert any("max_grad" in str(w.message) for w in caught) == fires


@pytest.mark.parametrize("kw, probes", [({"fused": True}, False), ({"fused": False}, False),
                                       ({"algorithm": "targetprop"}, True)],
                         ids=["bp-fused", "bp-batches", "targetprop"])
def test_the_gradient_probe_runs_only_for_steps_without_a_loss_gradient(digits, monkeypatch, kw,
                                                                        probes):
    # back-propagation's steps keep their gradient: no extra pass over the probe batch (it cost
    # 30% of a short LSTM epoch); Target Propagation's do not, and the probe still serves it
    import fastlib.grad

    calls = []
    original = fastlib.grad.value_and_grad

    def counted(*args, **kw):
        calls.append(1)
        return original(*args, **kw)

    monkeypatch.setattr(fastlib.grad, "value_and_grad", counted)
    r = fastlib.train(_model(), digits.x_train, digits.y_train, 2, 32, 0.1, "cross_entropy",
                      optimizer="SGD", verbose=False, **kw)
    assert not r.diverged and r.epochs_run == 2
    assert len(calls) == (2 if probes else 0)


# ---------------------------------------------------------------------------------------------
# healthy runs: the defaults never stop them

def _healthy(digits, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model = kw.pop("model", None) or _model()
        return fastlib.train(model, digits.x_train, kw.pop("y", digits.y_train), kw.pop(
            "epochs", 20), 32, kw.pop("lr"), kw.pop("loss", "cross_entropy"), verbose=False,
            **kw)


@pytest.mark.parametrize("kw", [
    dict(lr=1e-3, optimizer="Adam"),
    dict(lr=0.1, optimizer="SGD"),
    dict(lr=0.3, algorithm="targetprop", epochs=5),
], ids=["adam", "sgd", "targetprop"])
def test_healthy_digits_runs_are_not_stopped(digits, kw):
    r = _healthy(digits, **kw)
    assert not r.diverged and r.epochs_run == kw.get("epochs", 20) and r.stop_reason is None


def test_a_healthy_rbm_is_not_stopped(digits):
    rbm = fastlib.RBM(64, 64)
    r = _healthy(digits, model=rbm, y=None, loss=None, lr=0.1, optimizer="SGD",
                 algorithm="cd", epochs=5)
    assert not r.diverged and r.epochs_run == 5


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    [], ["--optimizer", "SGD", "--lr", "0.1"],
    ["--algorithm", "targetprop", "--lr", "0.3"], ["--algorithm", "targetprop", "--lr", "0.1"],
    ["--algorithm", "targetprop", "--lr", "0.03"],
    ["--algorithm", "targetprop", "--pure", "--lr", "0.1"],
    ["--algorithm", "cd", "--hidden", "64", "--optimizer", "SGD", "--lr", "0.1"],
    pytest.param(["--data", "mnist"], marks=pytest.mark.mnist),
], ids=lambda a: " ".join(a) or "default")
def test_the_readme_runs_are_not_stopped_by_the_defaults(argv, capsys, monkeypatch, request):
    import fastlib.training.early_stopping as rules   # the monitor calls the rules from here
    from reports import cli

    if "mnist" in argv:
        argv = argv + ["--data-dir", str(request.getfixturevalue("mnist_dir"))]
    checked = []

    def spy(*args, **kw):
        out = rules.__dict__["_original_check"](*args, **kw)
        checked.append(out)
        return out

    monkeypatch.setitem(rules.__dict__, "_original_check", rules.check_divergence)
    monkeypatch.setattr(rules, "check_divergence", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert cli.main(["train", *argv]) == 0
    assert checked and not any(checked)  # the rules ran after every epoch, none fired
    assert "diverged" not in capsys.readouterr().out


def test_probes_and_validation_of_a_compiled_run_hold_blas_to_one_thread(digits):
    # a product of a multi-threaded OpenBLAS leaves its workers spinning after it returns;
    # between compiled epochs (whose own threads run the pieces) the passes through the
    # layers must not wake them: every forward outside the epochs sees one BLAS thread
    from threadpoolctl import threadpool_info

    model = _model()
    seen = []
    forward = model.forward

    def recording(x):
        seen.append([lib["num_threads"] for lib in threadpool_info()
                     if lib["user_api"] == "blas"])
        return forward(x)

    model.forward = recording
    r = fastlib.train(model, digits.x_train, digits.y_train, 2, 32, 1e-3, "cross_entropy",
                      optimizer="Adam", verbose=False, fused=True, x_val=digits.x_test,
                      y_val=digits.y_test)
    assert r.path == "program"
    assert len(seen) >= 3           # the untrained-loss probe and two validation passes
    assert all(counts and set(counts) == {1} for counts in seen), seen
