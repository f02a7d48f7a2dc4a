"""`verigrad train`: train an MLP with fastlib on the digits or MNIST, print a per-epoch table.

Defaults: scikit-learn's bundled 8x8 digits (no download), a 64-128-10 ReLU MLP, Adam, float32,
a few seconds end to end. ``--data mnist`` reads the four IDX files from ``--data-dir`` (default:
``fastlib.datasets.mnist_dir``'s lookup; ``--download`` fetches them once, checked). A
stratified 10% of the training split is held out for validation (``--val-fraction``); the
test split is scored once at the end. A run that diverges keeps the epochs it ran in the
table, prints why it stopped once, and exits with :data:`EXIT_DIVERGED`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings

import numpy as np

from reports.commands.tables import wrap

#: the exit status of a run a divergence stopped (its last good weights are kept, the test
#: split scored and --save honoured; docs/cli.md lists every status)
EXIT_DIVERGED = 3

# per-data defaults for the options left unset
DATA_DEFAULTS = {"digits": {"epochs": 20, "batch_size": 32},
                 "mnist": {"epochs": 5, "batch_size": 32}}


def _hidden(text):
    # widths are positional (layer i is item i), so unlike a list of names an empty item is
    # refused, never dropped: "12,,4" is a missing width, and dropping it trained 64-12-4-10
    items = text.split(",")
    if not any(s.strip() for s in items):
        raise argparse.ArgumentTypeError(f"--hidden needs at least one width, e.g. 128 or "
                                         f"128,64; got {text!r}")
    empty = next((i for i, s in enumerate(items, 1) if not s.strip()), None)
    if empty is not None:
        raise argparse.ArgumentTypeError(f"--hidden {text!r} has an empty width (item {empty}); "
                                         "give one width per hidden layer, e.g. 128 or 128,64")
    try:
        sizes = [int(s) for s in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hidden takes comma-separated widths like 128,64; "
                                         f"got {text!r}") from None
    if any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"--hidden widths must be >= 1, got {text!r}")
    return sizes


def _activations():
    import optable

    return sorted(optable.activation_codes())


def _losses():
    from fastlib import losses

    return list(losses.LOSSES) + list(losses.DEPRECATED_ALIASES)


def _optimizers():
    from fastlib import optim

    return [cls.name for cls in optim.OPTIMIZERS.values()]


def _algorithms():
    from fastlib.training import ALIASES, algorithm_names

    return algorithm_names() + ["kBP", "kCD"] * bool(ALIASES)


#: other names of the algorithms, named by the did-you-mean of a refusal
ALGORITHM_HINTS = {"backprop": "bp", "backpropagation": "bp", "sgd": "bp",
                   "target_propagation": "targetprop", "target-propagation": "targetprop",
                   "rbm": "cd", "contrastive_divergence": "cd",
                   "contrastive-divergence": "cd"}


def add_arguments(parser):
    """The options of ``verigrad train``."""
    from reports.commands import arguments as shared

    a = parser.add_argument
    a("--data", choices=("digits", "mnist"), default="digits",
      help="data set (digits: bundled with scikit-learn, no download)")
    a("--data-dir", metavar="DIR", default=None,
      help="with --data mnist: the folder with the four MNIST IDX files",
      default_text="$VERIGRAD_MNIST_DIR, then the user cache, then ../shared/data/mnist")
    a("--download", action="store_true",
      help="with --data mnist: fetch the files missing from that folder (the user cache when "
           "none holds them) once, each checked by its SHA-256 ($VERIGRAD_MNIST_URL, default "
           "torchvision's mirror)")
    a("--hidden", type=_hidden, default=[128], help="hidden widths, at least one, e.g. 128,64",
      default_text="128")
    a("--activation", default="relu", choices=shared.LazyChoices(_activations),
      help="hidden activation")
    a("--loss", default="cross_entropy", choices=shared.LazyChoices(_losses),
      help="the loss (categorical_cross_entropy, mse and the binary ones train on one-hot "
           "targets; binary_cross_entropy on a sigmoid output layer, as it scores "
           "probabilities)")
    a("--optimizer", default="Adam", choices=shared.LazyChoices(_optimizers, ignore_case=True),
      help="optimizer, any case (the CLI's default is Adam; fastlib.train's is SGD, "
           "DataCode's)")
    a("--epochs", type=shared.positive_int, metavar="N", default=None, help="epochs",
      default_text=", ".join(f"{d['epochs']} for {name}" for name, d in DATA_DEFAULTS.items()))
    a("--batch-size", type=shared.positive_int, metavar="N", default=None,
      help="mini-batch size",
      default_text=", ".join(f"{d['batch_size']} for {name}"
                             for name, d in DATA_DEFAULTS.items()))
    a("--lr", type=shared.positive_float, default=1e-3, help="learning rate")
    shared.add_seed(parser, help="initialisation and shuffling seed")
    a("--dtype", choices=("float32", "float64", "bfloat16", "float16"), default="float32",
      help="the model's one dtype; bfloat16 / float16: mixed precision over float32 master "
           "weights (float16 with a dynamic loss scale)")
    shared.add_device(parser, help="where every step runs: cpu, or cuda (a GPU; refused at "
                                   "once without one, naming why)")
    a("--algorithm", default="bp",
      choices=shared.LazyChoices(_algorithms, ignore_case=True, hints=ALGORITHM_HINTS),
      help="registered training algorithm: bp, targetprop, cd (an RBM with --hidden's first "
           "width on the images alone); SINGA's kBP and kCD also work")
    a("--pure", action="store_true",
      help="with --algorithm targetprop: pure targets through the weights, not the chain rule")
    a("--update", choices=("gradient", "loom"), default="gradient",
      help="with --algorithm targetprop: each layer's update, the gradient of its gap "
           "or Loom's delta lr x input x gap (Dense layers)")
    a("--normalisation", choices=("row", "column"), default="row",
      help="with --algorithm targetprop --pure: divide each route by the input row's total "
           "|weight| (row: Loom's engine) or the output column's (column: Loom's document)")
    a("--cd-k", type=shared.positive_int, default=1,
      help="with --algorithm cd: Gibbs steps of CD-k")
    a("--gradient-clip", type=shared.nonnegative_float, default=0.0,
      help="0 (off) or the clipping threshold")
    a("--clip-mode", choices=("value", "norm"), default="value",
      help="value: clamp each gradient element to [-c, c], as Loom's engine; norm: "
           "scale all gradients when their global L2 norm exceeds c, as Loom's document")
    a("--val-fraction", type=shared.fraction, default=0.1,
      help="stratified part of the training split held out for validation, in [0, 1)")
    a("--early-stopping", action="store_true",
      help="train with train_sh: LR reduction on a plateau and early stopping")
    a("--monitor", default="val_loss", choices=("loss", "val_loss", "acc", "val_acc"),
      help="train_sh's monitor")
    a("--patience", type=shared.positive_int, default=5, help="train_sh's patience")
    a("--min-delta", type=shared.nonnegative_float, default=1.0,
      help="train_sh's minimum improvement in percent")
    a("--save", metavar="FILE", default=None,
      help="save the trained model to this .npz file", default_text="none")
    a("--checkpoint", metavar="FILE", default=None,
      help="write a training checkpoint here after every epoch", default_text="none")
    a("--resume", metavar="FILE", default=None,
      help="resume from a checkpoint (its architecture is used)", default_text="none")
    a("--plot", metavar="FILE", default=None,
      help="write loss and accuracy curves to this PNG file", default_text="none")
    a("--distributed", action="store_true",
      help="data-parallel over MPI: launch as mpiexec -n K verigrad train --distributed "
           "(needs verigrad[mpi]); only rank 0 prints, plots and saves")
    a("--blocks", type=shared.positive_int, default=8,
      help="with --distributed: blocks per batch, the fixed summation order; the number of "
           "ranks must divide it")
    a("--pieces", type=_pieces, metavar="N", default=None,
      help="with --algorithm bp: pieces each step of a compiled epoch is cut into; the same N "
           "gives the same bits on any machine",
      default_text="$VERIGRAD_PIECES, else chosen from this machine's cores")
    shared.add_progress(parser, "progress bar over the epochs (fastlib.train's verbose)")


def _pieces(text):
    from fastlib.training.piece_plan import check_pieces

    try:
        return check_pieces(text, "--pieces")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _load(args, dtype):
    from fastlib import datasets

    if args.data == "digits":
        return datasets.load_digits(None, dtype=dtype)
    # no --data-dir: load_mnist's own lookup ($VERIGRAD_MNIST_DIR, the user cache, then
    # ../shared/data/mnist), fetching into the cache with --download
    return datasets.load_mnist(None, args.data_dir, dtype=dtype, download=args.download)


#: the output activation each loss needs (the others take the raw, linear output: logits or
#: regression values); binary_cross_entropy scores probabilities, so its model ends in a
#: sigmoid, as a Keras model compiled with that loss would
OUTPUT_ACTIVATIONS = {"binary_cross_entropy": "sigmoid"}


def output_activation(loss):
    """The activation of the output layer that ``loss`` expects.

    Parameters
    ----------
    loss : str
        A canonical loss name (``fastlib.losses.resolve_loss``).

    Returns
    -------
    str
        ``"sigmoid"`` for ``binary_cross_entropy``, else ``"linear"``.
    """
    return OUTPUT_ACTIVATIONS.get(loss, "linear")


def _mlp(inputs, hidden, classes, activation, loss, dtype, seed):
    """The MLP ``inputs``-``hidden``-``classes``: ``activation`` on the hidden layers, the
    output layer's activation fitting ``loss``."""
    import fastlib

    widths = [inputs] + list(hidden) + [classes]
    layers = [fastlib.Dense(widths[i], widths[i + 1], activation)
              for i in range(len(widths) - 2)]
    layers.append(fastlib.Dense(widths[-2], widths[-1], output_activation(loss)))
    return fastlib.Sequential(layers, dtype=dtype, seed=seed)


def _targets(loss, y, classes):
    import fastlib

    if loss in ("cross_entropy", "sparse_cross_entropy"):
        return y
    return fastlib.onehot(y, classes, dtype=np.float32)


class _Table:
    """Prints one row per epoch as training goes (a ``train`` callback), the epoch a divergence
    stopped included (its loss as recorded, its validation not evaluated: nan)."""

    HEADER = f"{'epoch':>5}  {'loss':>9}  {'acc':>7}  {'val_loss':>9}  {'val_acc':>7}  " \
             f"{'lr':>9}  {'time s':>7}"

    def __init__(self, out):
        self.out = out
        print(self.HEADER, file=out)

    def on_epoch_end(self, epoch, logs):
        print(f"{epoch:>5}  {_cell(logs['loss'], 9)}  {_cell(logs['acc'], 7)}  "
              f"{_cell(logs['val_loss'], 9)}  {_cell(logs['val_acc'], 7)}  "
              f"{logs['lr']:9.3g}  {logs['epoch_time']:7.2f}", file=self.out, flush=True)


def _cell(value, width):
    """``value`` in ``width`` columns: 4 decimals, or 4 significant digits when that is wider
    (an exploding loss); ``-`` for no value."""
    if value is None:
        return "-".rjust(width)
    text = f"{value:{width}.4f}"
    return text if len(text) <= width else f"{value:{width}.4g}"


@contextlib.contextmanager
def _training_warnings(err):
    """fastlib's warnings as one line each on ``err``, without a source line; the divergence
    warning not at all (the ``stopped:`` line says it once)."""
    from fastlib.errors import DivergenceWarning

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"verigrad train: warning: {message}", file=err, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DivergenceWarning)
        warnings.showwarning = show
        yield


def _plot(path, hist):
    plt, fig, (ax_loss, ax_acc) = _two_panels()
    epochs = np.arange(1, len(hist["loss"]) + 1)
    ax_loss.plot(epochs, hist["loss"], "o-", label="train")
    if hist["val_loss"]:
        ax_loss.plot(epochs, hist["val_loss"], "s-", label="validation")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    ax_loss.legend()
    if any(a is not None for a in hist["acc"]):
        ax_acc.plot(epochs, hist["acc"], "o-", label="train")
        if hist["val_acc"]:
            ax_acc.plot(epochs, hist["val_acc"], "s-", label="validation")
        ax_acc.legend()
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    _save(plt, fig, path)


def _check_paths(args):
    """The paths given, checked before any data is read or any epoch runs (None: all fine)."""
    from reports.commands import checks

    data_dir = checks.writable_dir if args.download else checks.existing_dir
    problems = [data_dir(args.data_dir, "--data-dir") if args.data_dir else None,
                checks.existing_file(args.resume, "--resume") if args.resume else None]
    for option in ("save", "checkpoint", "plot"):
        value = getattr(args, option)
        if value:
            problems.append(checks.writable_file(value, f"--{option}"))
    if args.plot:
        problems.append(_plot_format_problem(args.plot))
    return next((p for p in problems if p), None)


def _plot_format_problem(path):
    """Why matplotlib cannot write the ``--plot`` file (None: it can), told by its extension:
    savefig picks the format from it, and would otherwise refuse only after the last epoch."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    known = ", ".join(formats)
    extension = os.path.splitext(path)[1][1:]
    if not extension:
        # savefig would add ".png" and write another file than the one named
        return (f"--plot {path}: has no file extension to tell matplotlib the format; name "
                f"the file {path}.png or give another extension it writes: {known}")
    if extension.lower() not in formats:
        return (f"--plot {path}: matplotlib cannot write the format {extension!r}; give the "
                f"file an extension it writes: {known} (e.g. .png)")
    return None


_MIXED = ("bfloat16", "float16")


def _check_combinations(args):
    """Options that do not go together (None: all fine)."""
    from fastlib.training import ALIASES

    algorithm = ALIASES.get(args.algorithm.strip().lower(), args.algorithm.strip().lower())
    if args.dtype in _MIXED:
        for flag, used in (("--algorithm " + algorithm, algorithm != "bp"),
                           ("--device cuda", args.device == "cuda"),
                           ("--distributed", getattr(args, "distributed", False))):
            if used:
                return (f"--dtype {args.dtype} (mixed precision) trains with --algorithm bp on "
                        f"the CPU in one process; drop {flag} or use --dtype float32")
    if args.data != "mnist":
        for flag, used in (("--data-dir", args.data_dir), ("--download", args.download)):
            if used:
                return f"{flag} applies only with --data mnist (the digits are bundled)"
    if args.pieces is not None and algorithm not in _piece_algorithms():
        return (f"--pieces applies to the compiled epoch of --algorithm "
                f"{' or '.join(_piece_algorithms())}; --algorithm {algorithm} has no piece plan: "
                "drop --pieces")
    if algorithm != "targetprop":
        for flag, used in (("--pure", args.pure), ("--update", args.update != "gradient"),
                           ("--normalisation", args.normalisation != "row")):
            if used:
                return f"{flag} only applies to --algorithm targetprop"
    for dest, flag, applies, where in _APPLIES_WITH:
        if _given(args, dest) and not applies(algorithm, args):
            return f"{flag} applies only with {where}; drop it or add {where}"
    if algorithm == "cd":
        if args.early_stopping:
            return "--early-stopping is not available with --algorithm cd"
        if args.distributed:
            from fastlib.training.distributed import UNSUPPORTED

            return (f"--algorithm cd does not run data-parallel: {UNSUPPORTED['cd']}; drop "
                    f"--distributed")
    if args.early_stopping and args.val_fraction == 0 and args.monitor.startswith("val_"):
        return (f"--early-stopping with --monitor {args.monitor} needs --val-fraction > 0 "
                f"(or --monitor {args.monitor[4:]})")
    return None


#: (dest, flag, whether it applies, where it does): options that mean something only beside
#: another; given alone (away from their default) they are refused, never silently ignored
_APPLIES_WITH = (
    ("normalisation", "--normalisation", lambda alg, a: a.pure, "--pure"),
    ("cd_k", "--cd-k", lambda alg, a: alg == "cd", "--algorithm cd"),
    ("monitor", "--monitor", lambda alg, a: a.early_stopping, "--early-stopping"),
    ("patience", "--patience", lambda alg, a: a.early_stopping, "--early-stopping"),
    ("min_delta", "--min-delta", lambda alg, a: a.early_stopping, "--early-stopping"),
    ("blocks", "--blocks", lambda alg, a: a.distributed, "--distributed"),
    ("clip_mode", "--clip-mode", lambda alg, a: a.gradient_clip > 0, "--gradient-clip C > 0"),
)


def _given(args, dest):
    """Whether option ``dest`` was moved from the parser's default."""
    parser = getattr(args, "_parser", None)
    return parser is not None and getattr(args, dest) != parser.get_default(dest)


def _piece_algorithms():
    """The algorithms whose options take ``pieces`` (the registry's own declaration)."""
    from fastlib.training import algorithms

    return [name for name in algorithms.algorithm_names()
            if "pieces" in (algorithms.get_algorithm(name).options or ())]


def _check_resume(args):
    """The ``--resume`` checkpoint held against the flags (None: it fits, or no --resume):
    readable as a checkpoint, its model the kind ``--algorithm`` trains, its dtype
    ``--dtype``'s."""
    if not args.resume:
        return None
    from fastlib.errors import CorruptFileError
    from fastlib.training import ALIASES
    from fastlib.training.checkpoint import load_checkpoint

    try:
        ckpt = load_checkpoint(args.resume)
    except CorruptFileError as exc:
        return f"--resume: {exc}"
    algorithm = ALIASES.get(args.algorithm.strip().lower(), args.algorithm.strip().lower())
    kind = (ckpt.architecture or {}).get("type", "model")
    problem = _kind_problem(args.resume, kind, algorithm, ckpt.config.get("algorithm"))
    if problem:
        return problem
    problem = None if algorithm == "cd" else _output_problem(args, ckpt)
    if problem:
        return problem
    dtype = "float32" if args.dtype in _MIXED else args.dtype
    if ckpt.dtype != dtype:
        return (f"--resume {args.resume}: the checkpoint holds a {ckpt.dtype} model; pass "
                f"--dtype {ckpt.dtype}")
    return None


def _kind_problem(path, kind, algorithm, written_by):
    """Why ``--algorithm algorithm`` cannot resume a checkpoint of a ``kind`` model (None: it
    can): cd trains an RBM and only an RBM; the others train layer models, never an RBM."""
    if (kind == "RBM") == (algorithm == "cd"):
        return None
    if kind == "RBM":
        fix = "cd"
    else:       # the algorithm recorded in the checkpoint, else the default that fits
        fix = written_by if written_by and written_by != "cd" else "bp"
    held = "an RBM" if kind == "RBM" else f"a layer model ({kind})"
    trains = "an RBM" if algorithm == "cd" else "layer models, not an RBM"
    return (f"--resume {path}: the checkpoint holds {held}, and --algorithm {algorithm} "
            f"trains {trains}; resume it with --algorithm {fix}")


def _output_problem(args, ckpt):
    """Why ``--loss`` cannot score the checkpoint's model output (None: it can): a model
    built for a linear output trains on and then fails binary_cross_entropy's probability
    check at the test split."""
    from fastlib import losses

    loss = losses.resolve_loss(args.loss)
    arch = ckpt.architecture or {}
    last = (arch.get("layers") or [arch])[-1]
    found = last.get("activation", "linear") if isinstance(last, dict) else "linear"
    needed = output_activation(loss)
    if needed == "linear" or found == needed:
        return None
    trained = ckpt.config.get("loss_type")
    fix = f"pass --loss {trained} (its loss) or" if trained and trained != loss else "use"
    return (f"--resume {args.resume}: the checkpoint's model ends in a {found} layer, and "
            f"--loss {loss} needs a {needed} output (probabilities); {fix} "
            f"--loss binary_cross_entropy_with_logits")


def validate(args):
    """Every usage error of ``verigrad train`` (None: none), before any banner or epoch:
    paths, option combinations, a ``--resume`` checkpoint that does not fit the flags and
    ``--device cuda`` without a usable GPU."""
    from reports.commands.arguments import cuda_problem

    return (_check_combinations(args) or _check_paths(args) or _check_resume(args)
            or cuda_problem(args))


def run(args) -> int:
    """Train, print the per-epoch table and the test accuracy; 0 on success, 1 on an error,
    2 on a usage error (see :func:`validate`), :data:`EXIT_DIVERGED` when a divergence
    stopped training."""
    problem = None if getattr(args, "_validated", False) else validate(args)
    if problem:
        print(f"verigrad train: {problem}", file=sys.stderr)
        return 2
    try:
        with _training_warnings(sys.stderr):
            return _run(args)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError, ImportError,
            NotImplementedError) as exc:
        print(f"verigrad train: error: {exc}", file=sys.stderr)
        return 1


def _run(args) -> int:
    import fastlib

    from reports.commands.arguments import progress_enabled
    from fastlib import datasets, losses

    from fastlib.training import ALIASES

    t0 = time.perf_counter()
    # SINGA's kBP / kCD name the same algorithms as bp / cd (the RBM path below keys on "cd")
    args.algorithm = ALIASES.get(args.algorithm.strip().lower(), args.algorithm)
    # a 16-bit --dtype trains the float32 model (its master weights) in mixed precision
    dtype = np.dtype(np.float32 if args.dtype in _MIXED else args.dtype)
    defaults = DATA_DEFAULTS[args.data]
    epochs = defaults["epochs"] if args.epochs is None else args.epochs
    batch_size = defaults["batch_size"] if args.batch_size is None else args.batch_size
    data = _load(args, dtype)
    classes = int(data.y_train.max()) + 1
    if args.val_fraction > 0:
        train, val = datasets.train_val_split(data.x_train, data.y_train, args.val_fraction)
    else:
        train, val = datasets.Split(data.x_train, data.y_train), None
    if args.algorithm.lower() == "cd":
        return _run_cd(args, data, train, val, epochs, batch_size, dtype, t0)
    loss = losses.resolve_loss(args.loss)
    y_train = _targets(loss, train.y, classes)
    y_val = None if val is None else _targets(loss, val.y, classes)
    y_test = _targets(loss, data.y_test, classes)

    rank, ranks, distributed = 0, 1, False
    if getattr(args, "distributed", False):
        from fastlib.training import distributed as dist

        (rank, ranks), distributed = dist.world(), dist.DataParallel(blocks=args.blocks)
    if args.resume:     # validate held its kind and dtype against the flags
        model = fastlib.load(args.resume)
        problem = _features_problem(args, model, data.x_train.shape[1])
        if problem:
            print(f"verigrad train: {problem}", file=sys.stderr)
            return 2
    else:
        model = _mlp(data.x_train.shape[1], args.hidden, classes, args.activation, loss, dtype,
                     args.seed)

    # only rank 0 speaks and writes files (the other ranks train the same model)
    out = sys.stdout if rank == 0 else open(os.devnull, "w")
    print(wrap(f"verigrad train: {args.data} ({len(train.x)} train, "
               f"{0 if val is None else len(val.x)} validation, {len(data.x_test)} test), "
               f"{_describe(model, classes, args.activation)}, {loss}, {args.optimizer} "
               f"lr={args.lr:g}, "
               f"batch {batch_size}, {epochs} epochs, "
               f"{args.dtype + ' mixed' if args.dtype in _MIXED else dtype.name}, "
               f"{args.algorithm}"),
          file=out)
    if distributed:
        print(f"data-parallel on {ranks} MPI rank(s), {args.blocks} blocks per batch (the fused "
              f"MLP epoch does not apply: gradients are exchanged after every step)", file=out)
    common = dict(gradient_clip=args.gradient_clip, clip_mode=args.clip_mode, seed=args.seed,
                  device=args.device, algorithm=args.algorithm, callbacks=[_Table(out)],
                  verbose=progress_enabled(args) and rank == 0,
                  checkpoint=args.checkpoint, resume=args.resume,
                  distributed=distributed)
    if args.dtype in _MIXED:
        common["dtype"] = args.dtype
    if args.pieces is not None:
        common["pieces"] = args.pieces
    if args.algorithm.lower() == "targetprop":
        common.update(use_chain_rule=not args.pure, update=args.update,
                      normalisation=args.normalisation)
    x_val = None if val is None else val.x
    with _compile_notice():
        result = _fit(args, model, train, y_train, epochs, batch_size, loss, x_val, y_val,
                      common, out)
    if result.stop_reason:
        print(f"stopped: {result.stop_reason}", file=out)
    if result.piece_plan is not None:
        pieces = result.piece_plan["pieces"]
        print(f"path {result.path} ({result.schedule} schedule), {pieces} "
              f"piece{'s' if pieces != 1 else ''} per step (from the "
              f"{result.piece_plan['source']}; --pieces {pieces} reproduces it)", file=out)
    if result.precision is not None:
        scale = ("no loss scale" if result.loss_scale is None else
                 f"loss scale {result.loss_scale:g} at the end ({result.loss_scale_skips} "
                 f"step{'s' if result.loss_scale_skips != 1 else ''} skipped by it)")
        print(f"precision {result.precision} over float32 master weights, {scale}", file=out)

    if args.dtype in _MIXED:     # the test split through the 16-bit forward it trained in
        from fastlib.training import mixed_precision

        pred_like = np.zeros((len(data.x_test), classes), np.float32)
        test_loss, test_acc = mixed_precision.evaluate(
            model, data.x_test, losses.validate_targets(loss, pred_like, y_test), loss,
            args.dtype)
    else:
        pred = model(data.x_test)
        test_loss = losses.loss_value(loss, pred, y_test)
        test_acc = losses.accuracy(loss, pred, y_test)
    acc_text = "-" if test_acc is None else f"{test_acc:.4f}"
    print(f"test loss {test_loss:.4f}  test accuracy {acc_text}  "
          f"({time.perf_counter() - t0:.1f} s total)", file=out)
    if rank != 0:
        return _status(result)
    if args.save:
        model.save(args.save)
        print(f"saved model to {args.save}", file=out)
    if args.plot:
        _plot(args.plot, {"loss": result.loss_history, "val_loss": result.val_loss_history,
                          "acc": result.accuracy_history, "val_acc": result.val_accuracy_history})
        print(f"wrote {args.plot}", file=out)
    return _status(result)


def _features_problem(args, model, features):
    """Why the ``--resume`` model cannot take the data's ``features`` per sample (None: it can).

    Checked once the data is read (its width is the loader's) and before the first epoch: a
    model built for other data would otherwise fail inside its first layer after compiling,
    without naming the checkpoint.
    """
    fix = "resume with the data it was trained on"
    needs = getattr(model, "in_width", None)
    if needs is None:   # a model whose first layer takes any width: ask the whole model
        try:
            model.infer_shape((1, features))
        except ValueError as exc:
            return (f"--resume {args.resume}: its model does not take the {args.data} data "
                    f"({features} features): {exc}; {fix}")
        except NotImplementedError:     # a layer that cannot tell: its first batch checks
            return None
        return None
    if needs != features:
        return (f"--resume {args.resume}: its model takes {needs} input features but the "
                f"{args.data} data has {features}; {fix}")
    return None


def _describe(model, classes, activation):
    """The banner's words for ``model``: ``MLP 64-128-10 relu`` (and its output layer's
    activation when that is not linear), else, for a resumed model of another shape, its
    type."""
    layers = getattr(model, "layers", None)     # a bare layer (a resumed Dense) has none
    if not layers or not all(hasattr(d, "in_features") for d in layers):
        return type(model).__name__
    widths = "-".join(str(d.in_features) for d in layers) + f"-{classes}"
    output = getattr(layers[-1], "activation", "linear")
    return f"MLP {widths} {activation}" + ("" if output == "linear" else f" ({output} output)")


def _compile_notice():
    """One line on stderr when the run compiles fastlib's kernels (a first run's long first
    epoch), on a terminal too: the epoch bar keeps the line it draws in."""
    from fastlib.compile_notice import CompileWatch

    return CompileWatch("verigrad train", live=False)


def _fit(args, model, train, y_train, epochs, batch_size, loss, x_val, y_val, common, out):
    """Train ``model`` as the flags ask (early stopping or not); the TrainingResult."""
    import fastlib

    if args.early_stopping:
        hist = fastlib.train_sh(model, train.x, y_train, epochs, batch_size, args.lr, loss,
                                args.optimizer, args.monitor, args.patience, args.min_delta,
                                True, x_val, y_val, **common)
        result = hist.result
        if hist.best_metric is not None:
            print(f"best {args.monitor} {hist.best_metric:.4f} at epoch {hist.best_epoch} "
                  f"(weights {'restored' if hist.restored_best else 'kept'}); "
                  f"{hist.lr_reductions} LR reduction(s)", file=out)
    else:
        result = fastlib.train(model, train.x, y_train, epochs, batch_size, args.lr, loss,
                               x_val, y_val, args.optimizer, **common)
    return result


def _status(result) -> int:
    """The exit status of a run that ended: :data:`EXIT_DIVERGED` after a divergence, else 0
    (early stopping and a callback's stop are normal ends)."""
    return EXIT_DIVERGED if result.diverged else 0


def _run_cd(args, data, train, val, epochs, batch_size, dtype, t0) -> int:
    """``--algorithm cd``: train an RBM on the images alone, plot its reconstruction error."""
    import fastlib

    from reports.commands.arguments import progress_enabled

    out = sys.stdout
    rbm_cls = fastlib.RBM        # importing fastlib.rbm also lets fastlib.load rebuild an RBM
    rbm = (fastlib.load(args.resume) if args.resume else
           rbm_cls(data.x_train.shape[1], args.hidden[0], dtype=dtype, seed=args.seed))
    problem = _features_problem(args, rbm, data.x_train.shape[1]) if args.resume else None
    if problem:
        print(f"verigrad train: {problem}", file=sys.stderr)
        return 2
    print(wrap(f"verigrad train: {args.data} images ({len(train.x)} train, "
               f"{0 if val is None else len(val.x)} validation), RBM {rbm.visible}-{rbm.hidden}, "
               f"CD-{args.cd_k}, {args.optimizer} lr={args.lr:g}, batch {batch_size}, "
               f"{epochs} epochs, {dtype.name}; loss = reconstruction error of the chain, "
               "val_loss = mean-field"), file=out)
    with _compile_notice():
        result = fastlib.train(rbm, train.x, None, epochs, batch_size, args.lr, None,
                               None if val is None else val.x, None,
                               args.optimizer, gradient_clip=args.gradient_clip,
                               clip_mode=args.clip_mode, seed=args.seed, device=args.device,
                               algorithm="cd", callbacks=[_Table(out)],
                               verbose=progress_enabled(args),
                               checkpoint=args.checkpoint, resume=args.resume, cd_k=args.cd_k)
    if result.stop_reason:
        print(f"stopped: {result.stop_reason}", file=out)
    print(f"test reconstruction error {rbm.reconstruction_error(data.x_test):.4f}  mean free "
          f"energy {float(rbm.free_energy(data.x_test).mean()):.2f}  "
          f"({time.perf_counter() - t0:.1f} s total)", file=out)
    if args.save:
        rbm.save(args.save)
        print(f"saved model to {args.save}", file=out)
    if args.plot:
        _plot_cd(args.plot, rbm.history, result.val_loss_history)
        print(f"wrote {args.plot}", file=out)
    return _status(result)


def _plot_cd(path, history, val_recon):
    """Reconstruction error and mean free energy per epoch (CD training)."""
    plt, fig, (ax_rec, ax_fe) = _two_panels()
    epochs = np.arange(1, len(history["reconstruction_error"]) + 1)
    ax_rec.plot(epochs, history["reconstruction_error"], "o-", label="train (CD chain)")
    if val_recon:
        ax_rec.plot(epochs, val_recon, "s-", label="validation (mean field)")
    ax_rec.set(xlabel="epoch", ylabel="mean (v - p(v|h))^2", title="reconstruction error")
    ax_rec.legend()
    ax_fe.plot(epochs, history["free_energy"], "o-")
    ax_fe.set(xlabel="epoch", ylabel="mean F(v)", title="free energy of the training data")
    _save(plt, fig, path)


def _two_panels():
    """``(pyplot, figure, (left, right))``: two panels side by side, drawn off-screen (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    return plt, fig, axes


def _save(plt, fig, path):
    """Grid every panel of ``fig``, write it to ``path`` (PNG, 100 dpi) and free it."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
