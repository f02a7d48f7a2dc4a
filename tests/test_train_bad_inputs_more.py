"""Bad input to ``train``, ``train_sh`` and their helpers gets a clear error before any work.

Each refusal names the argument, what was given and what is accepted, and comes before the
first epoch (no callback hears the run begin, the weights are untouched); the accepted
spellings beside each refusal still train. Covered: ``binary_cross_entropy`` on a model whose
outputs cannot be probabilities, flags given as strings, ``train_sh``'s policy values, a model
or callback of the wrong kind, inputs beyond a format's range (float16, float32) and labels or
token ids beyond int64, empty and ragged data, ``train_val_split``'s arguments, paths that
are folders or lie in missing folders, targets beyond the model's dtype, starting weights that
hold NaN, and a first batch whose loss overflows before any step.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import fastlib
import optable
from fastlib import datasets
from fastlib.training import TrainOptions
from fastlib.training.early_stopping import PlateauPolicy


def mlp(out_activation="linear", dtype=np.float64):
    return fastlib.Sequential([fastlib.Dense(4, 5, "relu"), fastlib.Dense(5, 3, out_activation)],
                              dtype=dtype, seed=0)


def data(n=20):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 4)), rng.integers(0, 3, size=(n, 1))


def binary_targets(n=20, width=3):
    return (np.random.default_rng(1).random((n, width)) > 0.5).astype(np.float64)


class Heard:
    """A callback that records whether the run began (a refusal must come before it)."""

    def __init__(self):
        self.began = False
        self.epochs = 0

    def on_train_begin(self, logs):
        self.began = True

    def on_epoch_end(self, epoch, logs):
        self.epochs += 1


def refused_before_training(error, words, model, *args, fn=None, **kwargs):
    """Call ``fn(model, *args, callbacks=[Heard()], **kwargs)``; it must raise ``error``
    matching ``words`` before the run begins and without changing the weights."""
    fn = fn or fastlib.train
    heard = Heard()
    before = {k: v.copy() for k, v in model.parameters().items()}
    with pytest.raises(error, match=words) as info:
        fn(model, *args, callbacks=[heard], verbose=False, **kwargs)
    assert not heard.began and heard.epochs == 0
    assert all(np.array_equal(before[k], v) for k, v in model.parameters().items())
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# binary_cross_entropy needs a model whose outputs are probabilities

class Identity(fastlib.Layer):
    """A custom layer that declares no output range."""

    def forward(self, x):
        return x

    def backward(self, g, need_input_grad=True):
        return g, {}

    def infer_shape(self, shape):
        return shape

    def get_config(self):
        return {"type": "Identity"}


def _not_probabilities():
    d = np.float64
    return {
        "linear Dense": mlp("linear"),
        "relu Dense": mlp("relu"),
        "tanh Dense": mlp("tanh"),
        "nested Sequential ending linear": fastlib.Sequential(
            [fastlib.Dense(4, 5, "sigmoid"), fastlib.Sequential([fastlib.Dense(5, 3)])],
            dtype=d),
        "LayerNorm last": fastlib.Sequential([fastlib.Dense(4, 3, "sigmoid"),
                                              fastlib.LayerNorm(3)], dtype=d),
        "Parallel adding sigmoids": fastlib.Sequential([fastlib.Parallel(
            [fastlib.Dense(4, 3, "sigmoid"), fastlib.Dense(4, 3, "sigmoid")], combine="add")],
            dtype=d),
        "Parallel with a linear branch": fastlib.Parallel(
            [fastlib.Dense(4, 2, "sigmoid"), fastlib.Dense(4, 1)], dtype=d),
    }


@pytest.mark.parametrize("name", list(_not_probabilities()))
def test_bce_refuses_a_model_whose_outputs_are_not_probabilities(name):
    model = _not_probabilities()[name]
    x, _ = data()
    message = refused_before_training(
        ValueError, r"binary_cross_entropy expects probabilities in \[0, 1\]", model, x,
        binary_targets(), 2, 8, 0.1, "binary_cross_entropy")
    assert "sigmoid" in message and "binary_cross_entropy_with_logits" in message


def test_bce_refuses_a_recurrent_output_and_names_the_last_layer():
    model = fastlib.Sequential([fastlib.LSTM(4, 3)], dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((6, 2, 4))
    message = refused_before_training(ValueError, "binary_cross_entropy", model, x,
                                      binary_targets(6), 1, 3, 0.1, "binary_cross_entropy")
    assert "LSTM(input_size=4, hidden_size=3" in message and "[-1, 1]" in message


@pytest.mark.parametrize("build", [
    lambda: mlp("sigmoid"),
    lambda: fastlib.Sequential([fastlib.Dense(4, 3), fastlib.Softmax()], dtype=np.float64),
    lambda: fastlib.Sequential([fastlib.Dense(4, 5, "relu"),
                                fastlib.Sequential([fastlib.Dense(5, 3, "sigmoid")])],
                               dtype=np.float64),
    lambda: fastlib.Parallel([fastlib.Dense(4, 2, "sigmoid"), fastlib.Dense(4, 1, "softmax")],
                             dtype=np.float64),
    # a custom last layer declares no range: not refused (its outputs here are sigmoids)
    lambda: fastlib.Sequential([fastlib.Dense(4, 3, "sigmoid"), Identity(np.float64)],
                               dtype=np.float64),
], ids=["sigmoid Dense", "Softmax", "nested sigmoid", "Parallel concat", "custom last layer"])
def test_bce_trains_a_model_whose_outputs_are_probabilities(build):
    x, _ = data()
    r = fastlib.train(build(), x, binary_targets(), 1, 8, 0.1, "binary_cross_entropy",
                      verbose=False)
    assert np.isfinite(r.loss_history[0])


@pytest.mark.parametrize("name", sorted(optable.activation_codes()))
def test_every_activation_s_declared_bounds_hold_on_its_values(name):
    # the table's bounds against the activation's own values, from -40 to 40 (float64)
    layer = fastlib.Dense(4, 4, name, dtype=np.float64)
    params = layer.parameters()
    params["weight"][...] = np.eye(4)
    params["bias"][...] = 0.0
    x = np.linspace(-40.0, 40.0, 4000).reshape(1000, 4)
    y = layer.forward(layer.check_input(x))
    low, high = layer.output_range
    assert low <= y.min() and y.max() <= high
    if name in ("sigmoid", "softmax"):
        assert (low, high) == (0.0, 1.0)


def test_recurrent_and_custom_layers_ranges():
    assert fastlib.RNN(2, 3).output_range == (-1.0, 1.0)
    assert Identity().output_range is None


# ---------------------------------------------------------------------------------------------
# flags are True or False, never a truthy string

@pytest.mark.parametrize("fn, kwargs, name", [
    ("train", {"shuffle": "False"}, "shuffle"),
    ("train", {"fused": "no"}, "fused"),
    ("train", {"fused": 0}, "fused"),
    ("train_sh", {"restore_best": "no", "monitor": "loss"}, "restore_best"),
    ("train_sh", {"shuffle": "no", "monitor": "loss"}, "shuffle"),
])
def test_flags_refuse_anything_but_true_or_false(fn, kwargs, name):
    x, y = data()
    refused_before_training(TypeError, f"{name} must be True or False, got", mlp(), x, y, 1, 8,
                            0.1, "cross_entropy", fn=getattr(fastlib, fn), **kwargs)


def test_train_options_refuse_a_string_flag():
    with pytest.raises(TypeError, match="shuffle must be True or False, got 'False'"):
        TrainOptions(shuffle="False")


def test_numpy_flags_are_flags():
    x, y = data()
    common = dict(shuffle=np.False_, verbose=False)
    plain = fastlib.train(mlp(), x, y, 1, 8, 0.1, "cross_entropy", shuffle=False, fused=False,
                          verbose=False)
    numpy = fastlib.train(mlp(), x, y, 1, 8, 0.1, "cross_entropy", fused=np.False_, **common)
    assert numpy.loss_history == plain.loss_history and numpy.path == "generic"
    h = fastlib.train_sh(mlp(), x, y, 2, 8, 0.1, "cross_entropy", monitor="loss",
                         restore_best=np.True_, distributed=np.False_, **common)
    assert h.restored_best


# ---------------------------------------------------------------------------------------------
# train_sh's policy values

def test_train_sh_takes_numpy_integers_like_train():
    x, y = data()
    h = fastlib.train_sh(mlp(), x, y, np.int64(1), 8, 0.1, "cross_entropy", monitor="loss",
                         patience=np.int64(3), stop_patience=np.int64(4), verbose=False)
    assert len(h.loss) == 1
    policy = PlateauPolicy(lr=np.float32(0.5), patience=np.int64(3), min_delta=np.float32(1),
                           min_lr=np.float64(0))
    json.dumps(policy.state_dict())     # checkpoints save it as JSON


@pytest.mark.parametrize("kwargs, words", [
    ({"min_delta": "1"}, r"min_delta must be a percentage >= 0 \(1.0 means 1%\), got '1'"),
    ({"min_delta": None}, "min_delta must be a percentage >= 0.*got None"),
    ({"lr_factor": None}, r"lr_factor must be a number in \(0, 1\], got None"),
    ({"min_lr": "0"}, "min_lr must be a finite number >= 0, got '0'"),
    ({"monitor": ["loss"]}, r"monitor must be one of loss, val_loss, acc, val_acc, got \['loss'\]"),
    ({"patience": "3"}, "patience must be an int, got str"),
    ({"patience": 2.0}, "patience must be an int, got float"),
])
def test_train_sh_names_a_policy_value_of_the_wrong_type(kwargs, words):
    x, y = data()
    kwargs.setdefault("monitor", "loss")
    refused_before_training(TypeError, words, mlp(), x, y, 1, 8, 0.1, "cross_entropy",
                            fn=fastlib.train_sh, **kwargs)


def test_train_sh_refuses_a_min_lr_above_its_learning_rate():
    x, y = data()
    refused_before_training(ValueError, r"min_lr=1 is above the learning rate 0\.1",
                            mlp(), x, y, 1, 8, 0.1, "cross_entropy", fn=fastlib.train_sh,
                            monitor="loss", min_lr=1.0)
    # equal is a floor the first reduction crosses: taken (it stops at the first plateau)
    fastlib.train_sh(mlp(), x, y, 1, 8, 0.1, "cross_entropy", monitor="loss", min_lr=0.1,
                     verbose=False)


# ---------------------------------------------------------------------------------------------
# the model and the callbacks

@pytest.mark.parametrize("fn", ["train", "train_sh"])
@pytest.mark.parametrize("model, words", [
    (object(), r"model must be a fastlib layer or container, e\.g\. fastlib\.Sequential.*got "
               r"object"),
    ([fastlib.Dense(4, 3)], r"model is a list of 1 layer\(s\); chain them in a container: "
                            r"fastlib\.Sequential\(\[\.\.\.\]\)"),
    (fastlib.Dense, r"model is the class Dense, not a layer; build one first"),
], ids=["object", "list of layers", "a layer class"])
def test_train_refuses_a_model_that_is_not_a_layer(fn, model, words):
    x, y = data()
    kwargs = {"monitor": "loss"} if fn == "train_sh" else {}
    with pytest.raises(TypeError, match=rf"{fn}\(\): {words}"):
        getattr(fastlib, fn)(model, x, y, 1, 8, 0.1, "cross_entropy", verbose=False, **kwargs)


def test_save_model_refuses_what_is_not_a_layer(tmp_path):
    with pytest.raises(TypeError, match="save_model: model must be a fastlib layer.*got object"):
        fastlib.io.save_model(object(), tmp_path / "m.npz")
    with pytest.raises(TypeError, match="save_model: model is the class Dense"):
        fastlib.io.save_model(fastlib.Dense, tmp_path / "m.npz")
    assert not list(tmp_path.iterdir())


def test_a_single_callback_counts_as_a_list_of_one():
    # as Keras (callbacks=cb) and PyTorch Lightning (Trainer(callbacks=cb)) take it
    x, y = data()
    seen = []
    fastlib.train(mlp(), x, y, 2, 8, 0.1, "cross_entropy", verbose=False,
                  callbacks=lambda epoch, logs: seen.append(epoch))
    heard = Heard()
    fastlib.train(mlp(), x, y, 2, 8, 0.1, "cross_entropy", verbose=False, callbacks=heard)
    assert seen == [1, 2] and heard.began and heard.epochs == 2


@pytest.mark.parametrize("callbacks, words", [
    ("on_epoch_end", "callbacks must be a callback or a list of them"),
    (5, "callbacks must be a callback or a list of them.*got 5"),
    ([Heard], r"callback Heard is a class; pass an instance, Heard\(\.\.\.\)"),
])
def test_callbacks_of_the_wrong_kind_are_named(callbacks, words):
    x, y = data()
    model = mlp()
    with pytest.raises(TypeError, match=words):
        fastlib.train(model, x, y, 1, 8, 0.1, "cross_entropy", verbose=False,
                      callbacks=callbacks)


# ---------------------------------------------------------------------------------------------
# values beyond a format's range

def test_float16_training_refuses_inputs_beyond_its_range():
    x, y = data()
    model = mlp(dtype=np.float32)
    big = np.full((20, 4), 1e5, np.float32)
    message = refused_before_training(
        ValueError, r"x: 80 value\(s\) are beyond float16's range \(largest finite 65504\)",
        model, big, y, 1, 8, 0.01, "cross_entropy", dtype="float16")
    assert "scale the data" in message and "dtype='bfloat16'" in message
    x_val = x[:2].astype(np.float32)
    x_val[1, 2] = -7e4
    refused_before_training(ValueError, r"x_val: 1 value\(s\) .* the first at index "
                            r"\(1, 2\) \(-70000\)", model, x.astype(np.float32), y, 1, 8, 0.01,
                            "cross_entropy", dtype="float16", x_val=x_val, y_val=y[:2])
    # 65504 itself, and bfloat16's wider range, are taken
    edge = x.astype(np.float32)
    edge[0, 0] = 65504.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # what such inputs do to the run is not the point
        for fmt, inputs in (("float16", edge), ("bfloat16", big)):
            fastlib.train(mlp(dtype=np.float32), inputs, y, 1, 8, 1e-6, "cross_entropy",
                          dtype=fmt, verbose=False, divergence=False)


def test_a_value_beyond_float32_is_said_to_overflow_without_numpys_warning():
    _, y = data()
    x = np.full((20, 4), 1e300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        message = refused_before_training(ValueError, r"input value 1e\+300 at index \(0, 0\) "
                                          r"is beyond float32's range", mlp(dtype=np.float32), x,
                                          y, 1, 8, 0.1, "cross_entropy")
    assert "NaN or Inf" not in message and "dtype=np.float64" in message
    x = np.zeros((20, 4))
    x[3, 1] = np.inf      # an Inf the data really holds is still called one
    with pytest.raises(ValueError, match=r"input contains NaN or Inf \(first at index \(3, 1\), "
                                         r"value inf\)"):
        mlp(dtype=np.float32)(x)


def test_labels_and_token_ids_beyond_int64_are_named_as_given():
    x, _ = data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refused_before_training(ValueError, r"class index 1e\+30 at row 0 is out of range for 3 "
                                r"classes", mlp(), x, np.full((20, 1), 1e30), 1, 8, 0.1,
                                "cross_entropy")
        emb = fastlib.Sequential([fastlib.Embedding(5, 4), fastlib.Dense(4, 3)])
        with pytest.raises(ValueError, match=r"Embedding: index 1e\+30 out of range \[0, 5\)"):
            emb(np.full((20,), 1e30))
        # a whole float in int64's range reads as the int it stands for
        with pytest.raises(ValueError, match=r"Embedding: index 7 out of range"):
            emb(np.array([1.0, 7.0]))
        with pytest.raises(ValueError, match=r"class index 3 at row 1"):
            fastlib.losses.validate_targets("cross_entropy", np.zeros((2, 3)), [[0.0], [3.0]])


# ---------------------------------------------------------------------------------------------
# empty, ragged and mismatched data

def test_empty_or_ragged_data_is_named():
    x, y = data()
    refused_before_training(ValueError, r"x_val has no samples \(shape \(0, 4\)\); pass at least "
                            r"one \(or leave the validation data out\)", mlp(), x, y, 1, 8, 0.1,
                            "cross_entropy", x_val=x[:0], y_val=y[:0])
    refused_before_training(ValueError, r"x has no samples \(shape \(0, 4\)\)", mlp(), x[:0],
                            y[:0], 1, 8, 0.1, "cross_entropy")
    ragged = [[1.0, 2.0, 3.0, 4.0], [1.0]] * 10
    refused_before_training(ValueError, "x: its rows have different lengths", mlp(), ragged, y,
                            1, 8, 0.1, "cross_entropy")
    refused_before_training(ValueError, "y: its rows have different lengths", mlp(), x,
                            [[0], []] * 10, 1, 8, 0.1, "cross_entropy")


def test_train_val_split_names_its_bad_arguments():
    x, y = data()
    with pytest.raises(ValueError, match=r"fraction=0.99 holds out all 20 samples .* leaving "
                                         "none to train on"):
        datasets.train_val_split(x, y, 0.99)
    with pytest.raises(ValueError, match=r"x of shape \(20, 4\) and y of shape \(10, 1\) need "
                                         "the same number of rows"):
        datasets.train_val_split(x, y[:10], 0.1)
    with pytest.raises(TypeError, match=r"fraction must be a number in \[0, 1\), got '0.1'"):
        datasets.train_val_split(x, y, "0.1")
    (xt, yt), (xv, yv) = datasets.train_val_split(x.tolist(), y.tolist(), 0.1)
    expect = datasets.train_val_split(x, y, 0.1)
    assert np.array_equal(xt, expect[0].x) and np.array_equal(yv, expect[1].y)


# ---------------------------------------------------------------------------------------------
# paths

def test_load_of_a_folder_says_it_is_a_folder(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder, not a file"):
        fastlib.load(tmp_path)
    x, y = data()
    refused_before_training(IsADirectoryError, "is a folder, not a file", mlp(), x, y, 1, 8, 0.1,
                            "cross_entropy", resume=tmp_path)


def test_checkpoint_paths_are_checked_before_the_first_epoch(tmp_path):
    x, y = data()
    folder = tmp_path / "run.npz"
    folder.mkdir()
    refused_before_training(IsADirectoryError, r"checkpoint=.*run\.npz' is a folder; pass a "
                            r"file name, e\.g\. .*checkpoint\.npz", mlp(), x, y, 2, 8, 0.1,
                            "cross_entropy", checkpoint=folder)
    missing = tmp_path / "no" / "such" / "c.npz"
    refused_before_training(FileNotFoundError, r"checkpoint=.*c\.npz': folder .*such' does not "
                            "exist; create it first", mlp(), x, y, 2, 8, 0.1, "cross_entropy",
                            checkpoint=missing)
    refused_before_training(TypeError, "checkpoint must be a file path", mlp(), x, y, 2, 8, 0.1,
                            "cross_entropy", checkpoint=5)
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"] and not list(folder.iterdir())


def test_the_range_check_counts_every_chunk_and_names_the_first_value(monkeypatch):
    # the check reads the inputs a few rows at a time (no rounded copy of the data set): the
    # count and the first index must be those of the whole array, whatever the chunk size
    from fastlib.training import mixed_precision

    monkeypatch.setattr(mixed_precision, "_CHUNK_VALUES", 8)     # two rows of 4 per chunk
    x = np.zeros((20, 4), np.float32)
    x[3, 1], x[3, 2], x[17, 0] = 7e4, -1e5, np.inf       # inf itself is not an overflow
    x[11, 3] = 65504.0                                   # float16's largest finite value
    with pytest.raises(ValueError, match=r"x: 2 value\(s\) are beyond float16's range "
                                         r"\(largest finite 65504\), the first at index "
                                         r"\(3, 1\) \(70000\)"):
        mixed_precision.check_inputs(x, "float16", "x")
    mixed_precision.check_inputs(x[4:], "float16", "x")      # inf and 65504 pass


# ---------------------------------------------------------------------------------------------
# targets beyond the model's dtype, starting weights that are not finite, a first batch that
# overflows before any step

def test_a_target_beyond_float32_is_named_with_its_argument():
    x, _ = data()
    y = np.zeros((20, 3))
    y[2, 1] = 1e200
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # no NumPy overflow warning on the way
        message = refused_before_training(
            ValueError, r"^y: mse: target 1e\+200 at index \(2, 1\) is beyond float32's range",
            mlp(dtype=np.float32), x.astype(np.float32), y, 1, 8, 0.1, "mse")
        assert "dtype=np.float64" in message
        refused_before_training(
            ValueError, r"^y_val: mse: target -1e\+39 at index \(0, 0\)", mlp(dtype=np.float32),
            x.astype(np.float32), np.zeros((20, 3)), 1, 8, 0.1, "mse",
            x_val=x[:2].astype(np.float32), y_val=np.full((2, 3), -1e39))
    # the same values fit a float64 model
    fastlib.train(mlp(), x, y / 1e190, 1, 8, 1e-3, "mse", verbose=False, divergence=False)


def test_a_validation_input_the_model_refuses_is_named_x_val():
    x, y = data()
    with pytest.raises(ValueError, match=r"^x_val: .*4 features"):
        fastlib.train(mlp(), x, y, 1, 8, 0.1, "cross_entropy", x_val=x[:2, :3], y_val=y[:2],
                      verbose=False)


def test_starting_weights_that_hold_nan_are_refused_before_training():
    x, y = data()
    model = mlp()
    model.parameters()["1.bias"][2] = np.nan
    heard = Heard()
    with pytest.raises(ValueError, match=r"parameter '1\.bias' holds nan at index \(2,\) before "
                                         r"training"):
        fastlib.train(model, x, y, 1, 8, 0.1, "cross_entropy", callbacks=[heard], verbose=False)
    assert not heard.began


@pytest.mark.parametrize("fused", [True, False], ids=["compiled", "per-batch"])
def test_a_first_batch_that_overflows_float16_does_not_blame_the_learning_rate(fused):
    # 6e4 is a float16 number, but the layer's output on it, 4 * 6e4 * 0.5, is not: the run
    # stops on the first batch, before any step, and says so
    _, y = data()
    x = np.full((20, 4), 6e4, np.float32)
    model = fastlib.Sequential([fastlib.Dense(4, 3)], seed=0)
    model.parameters()["0.weight"][...] = 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastlib.DivergenceWarning)
        result = fastlib.train(model, x, y, 2, 8, 1e-3, "cross_entropy", dtype="float16",
                               fused=fused, verbose=False)
    assert result.diverged and "epoch 1, batch 1" in result.stop_reason
    assert "before any update" in result.stop_reason and "65504" in result.stop_reason
    assert "lower the learning rate" not in result.stop_reason
    # a run that diverges after steps still points at the learning rate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastlib.DivergenceWarning)
        later = fastlib.train(mlp(dtype=np.float32), np.ones((20, 4), np.float32), y, 3, 4,
                              1e30, "cross_entropy", fused=fused, verbose=False)
    assert later.diverged and "lower the learning rate" in later.stop_reason


@pytest.mark.parametrize("last, loss, binary", [
    (lambda: fastlib.Dense(5, 3, "softmax"), "cross_entropy", False),
    (lambda: fastlib.Softmax(), "categorical_cross_entropy", False),
    (lambda: fastlib.Dense(5, 3, "sigmoid"), "binary_cross_entropy_with_logits", True)])
def test_a_logit_loss_on_squashed_outputs_warns_before_training(last, loss, binary):
    x, y = data()
    layers = [fastlib.Dense(4, 5, "relu"), last()]
    if isinstance(layers[-1], fastlib.Softmax):
        layers.insert(1, fastlib.Dense(5, 3))
    model = fastlib.Sequential(layers, seed=0)
    targets = (binary_targets() if binary else
               fastlib.onehot(y.ravel(), 3) if loss == "categorical_cross_entropy" else y)
    heard = Heard()
    with pytest.warns(UserWarning, match=rf"{loss} takes logits .* squashed twice") as got:
        fastlib.train(model, x, targets, 1, 8, 0.1, loss, callbacks=[heard], verbose=False)
    assert heard.began and got[0].filename == __file__   # it trains, and points at this call


def test_a_logit_loss_on_logits_and_bce_on_probabilities_do_not_warn():
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        fastlib.train(mlp(), x, y, 1, 8, 0.1, "cross_entropy", verbose=False)
        fastlib.train(mlp("sigmoid"), x, binary_targets(), 1, 8, 0.1, "binary_cross_entropy",
                      verbose=False)
