"""`verigrad bench ops`: fastlib's kernels against plain NumPy code for the same math.

Every op of the table is timed forward and VJP in float32, twice: the kernels alone (inputs
validated once through ``fastlib.ops.bind``) and the public entry points ``fastlib.forward`` /
``fastlib.vjp`` (validation included), on sizes that matter: activations, binary ops and
reductions on 1e6 elements, matmul 64x784 @ 784x128, softmax / log_softmax / layer_norm /
rms_norm on 64x1024, losses on 256x10. The NumPy column is the straightforward vectorised
NumPy (and ``scipy.special.erf`` for GELU) a user would otherwise write. The ratio is the
kernels' time over NumPy's (below 1: fastlib is faster); the api ratio adds the validation,
which matters only for tiny inputs (the 256x10 losses: ~10 us per call). Times are the best
of several repeats, each the mean of enough calls to last ~5 ms (short repeats, so that on a
shared machine some of them run undisturbed; the minimum is the least disturbed). Parallel
kernels use the idle cores only (``fastlib.config.ADAPTIVE_THREADS``); ``--threads`` fixes
the count.

Start-up: ``import fastlib`` plus the first forward and VJP of a Dense-like step (matmul, add,
relu), measured in fresh subprocesses: cold (an empty Numba cache: every kernel compiles) and
warm (a second process on the same cache: ``cache=True`` loads the compiled kernels).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

F32 = np.float32


# --- NumPy baselines -------------------------------------------------------------------------

def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _erf(x):
    from scipy.special import erf
    return erf(x)


_C = F32(np.sqrt(2 / np.pi))
_A = F32(0.044715)
_S2 = F32(np.sqrt(2.0))


def _gelu_tanh_vjp(x, g):
    u = _C * (x + _A * x**3)
    t = np.tanh(u)
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * _A * x * x))


def _gelu_vjp(x, g):
    return g * (0.5 * (1 + _erf(x / _S2)) + x * np.exp(-0.5 * x * x) / F32(np.sqrt(2 * np.pi)))


# name -> (numpy forward(*inputs), numpy vjp(*inputs, g) -> tuple)
UNARY_NUMPY = {
    "neg": (lambda x: -x, lambda x, g: (-g,)),
    "exp": (np.exp, lambda x, g: (g * np.exp(x),)),
    "log": (np.log, lambda x, g: (g / x,)),
    "sqrt": (np.sqrt, lambda x, g: (g * 0.5 / np.sqrt(x),)),
    "square": (np.square, lambda x, g: (2 * g * x,)),
    "abs": (np.abs, lambda x, g: (g * np.sign(x),)),
    "relu": (lambda x: np.maximum(x, 0), lambda x, g: (g * (x > 0),)),
    "leaky_relu": (lambda x: np.where(x > 0, x, F32(0.01) * x),
                   lambda x, g: (np.where(x > 0, g, F32(0.01) * g),)),
    "silu": (lambda x: x * _sigmoid(x),
             lambda x, g: ((lambda s: g * s * (1 + x * (1 - s)))(_sigmoid(x)),)),
    "gelu": (lambda x: 0.5 * x * (1 + _erf(x / _S2)), lambda x, g: (_gelu_vjp(x, g),)),
    "gelu_tanh": (lambda x: 0.5 * x * (1 + np.tanh(_C * (x + _A * x**3))),
                  lambda x, g: (_gelu_tanh_vjp(x, g),)),
    "tanh": (np.tanh, lambda x, g: (g * (1 - np.tanh(x) ** 2),)),
    "sigmoid": (_sigmoid, lambda x, g: ((lambda s: g * s * (1 - s))(_sigmoid(x)),)),
    "softplus": (lambda x: np.logaddexp(F32(0), x), lambda x, g: (g * _sigmoid(x),)),
    "identity": (lambda x: x.copy(), lambda x, g: (g.copy(),)),
}

BINARY_NUMPY = {
    "add": (np.add, lambda a, b, g: (g.copy(), g.copy())),
    "sub": (np.subtract, lambda a, b, g: (g.copy(), -g)),
    "mul": (np.multiply, lambda a, b, g: (g * b, g * a)),
    "div": (np.divide, lambda a, b, g: (g / b, -g * a / (b * b))),
    "maximum": (np.maximum, lambda a, b, g: (g * (a >= b), g * (a < b))),
}


def _lse(x, axis=None, keepdims=False):
    m = x.max(axis=axis, keepdims=True)
    out = m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
    return out if keepdims else np.squeeze(out, axis=axis)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x, eps=F32(1e-5)):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)


def _layer_norm_vjp(x, g, eps=F32(1e-5)):
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    y = (x - mu) * r
    return (r * (g - g.mean(-1, keepdims=True) - y * (g * y).mean(-1, keepdims=True)),)


def _rms_norm_vjp(x, g, eps=F32(1e-6)):
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    y = x * r
    return (r * (g - y * (g * y).mean(-1, keepdims=True)),)


def _ce(z, t):
    return np.mean(_lse(z, -1) - z[np.arange(z.shape[0]), t])


def _ce_vjp(z, t, g):
    p = _softmax(z)
    p[np.arange(z.shape[0]), t] -= 1
    return (p * (g / z.shape[0]), None)


def _bce_logits(z, t):
    return np.mean(np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z))))


# --- cases ---------------------------------------------------------------------------------

def cases(rng):
    """(label, op, inputs, params, numpy forward, numpy vjp) for every benchmarked row."""
    n = 1_000_000
    x = rng.standard_normal(n).astype(F32)
    xpos = (np.abs(x) + F32(0.1)).astype(F32)
    out = []
    for name, (fwd, bwd) in UNARY_NUMPY.items():
        inp = xpos if name in ("log", "sqrt") else x
        out.append((f"{name}", name, [inp], {}, fwd, bwd))
    b = rng.standard_normal(n).astype(F32)
    bnz = (np.sign(b) * (np.abs(b) + F32(0.5))).astype(F32)
    for name, (fwd, bwd) in BINARY_NUMPY.items():
        out.append((name, name, [x, bnz if name == "div" else b], {}, fwd, bwd))
    m2 = x.reshape(1000, 1000)
    bias = rng.standard_normal(1000).astype(F32)
    out.append(("add (1000x1000 + bias)", "add", [m2, bias], {}, np.add,
                lambda a, c, g: (g.copy(), g.sum(0))))
    out += [
        ("sum", "sum", [x], {}, np.sum,
         lambda x, g: (np.broadcast_to(g, x.shape).copy(),)),
        ("mean", "mean", [x], {}, np.mean,
         lambda x, g: (np.broadcast_to(g / x.size, x.shape).copy(),)),
        ("logsumexp", "logsumexp", [x], {}, _lse,
         lambda x, g: (g * np.exp(x - _lse(x)),)),
        ("sum axis=0 (1000x1000)", "sum", [m2], {"axis": 0}, lambda v: v.sum(0),
         lambda v, g: (np.broadcast_to(g, v.shape).copy(),)),
    ]
    a = rng.standard_normal((64, 784)).astype(F32)
    w = (rng.standard_normal((784, 128)) / 28).astype(F32)
    out.append(("matmul 64x784 @ 784x128", "matmul", [a, w], {}, np.matmul,
                lambda a, w, g: (g @ w.T, a.T @ g)))
    r = rng.standard_normal((64, 1024)).astype(F32)
    out += [
        ("softmax 64x1024", "softmax", [r], {}, _softmax,
         lambda x, g: ((lambda y: y * (g - (g * y).sum(-1, keepdims=True)))(_softmax(x)),)),
        ("log_softmax 64x1024", "log_softmax", [r], {}, lambda x: x - _lse(x, -1, True),
         lambda x, g: (g - _softmax(x) * g.sum(-1, keepdims=True),)),
        ("layer_norm 64x1024", "layer_norm", [r], {}, _layer_norm, _layer_norm_vjp),
        ("rms_norm 64x1024", "rms_norm", [r], {},
         lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + F32(1e-6)), _rms_norm_vjp),
    ]
    z = rng.standard_normal((256, 10)).astype(F32)
    t = rng.integers(0, 10, 256)
    onehot = np.eye(10, dtype=F32)[t]
    p = _sigmoid(z).astype(F32)
    tb = (rng.random((256, 10)) < 0.5).astype(F32)
    g0 = F32(1.0)
    out += [
        ("mse 256x10", "mse", [z, onehot], {}, lambda p, q: np.mean((p - q) ** 2),
         lambda p, q, g: (lambda d: (d, -d))(2 * (p - q) * (g / p.size))),
        ("cross_entropy 256x10", "cross_entropy", [z, t], {}, _ce, _ce_vjp),
        ("categorical_cross_entropy 256x10", "categorical_cross_entropy", [z, onehot], {},
         lambda z, q: -np.mean((q * (z - _lse(z, -1, True))).sum(-1)),
         lambda z, q, g: ((_softmax(z) - q) * (g / z.shape[0]),
                          -(z - _lse(z, -1, True)) * (g / z.shape[0]))),
        ("binary_cross_entropy 256x10", "binary_cross_entropy", [p, tb], {},
         lambda p, q: -np.mean(q * np.log(p) + (1 - q) * np.log1p(-p)),
         lambda p, q, g: ((p - q) / (p * (1 - p)) * (g / p.size),
                          (np.log1p(-p) - np.log(p)) * (g / p.size))),
        ("binary_cross_entropy_with_logits 256x10", "binary_cross_entropy_with_logits",
         [z, tb], {}, _bce_logits,
         lambda z, q, g: ((_sigmoid(z) - q) * (g / z.size), -z * (g / z.size))),
    ]
    out += [
        ("transpose 1000x1000", "transpose", [m2], {}, lambda v: np.ascontiguousarray(v.T),
         lambda v, g: (np.ascontiguousarray(g.T),)),
        ("reshape 1e6", "reshape", [x], {"shape": (1000, 1000)},
         lambda v: v.reshape(1000, 1000).copy(), lambda v, g: (g.reshape(v.shape).copy(),)),
        ("concat 2 x 1000x500", "concat", [m2[:, :500].copy(), m2[:, 500:].copy()],
         {"axis": 1}, lambda u, v: np.concatenate([u, v], 1),
         lambda u, v, g: (g[:, :500].copy(), g[:, 500:].copy())),
        ("slice 1e6 ::2", "slice", [x], {"step": 2}, lambda v: v[::2].copy(),
         lambda v, g: (lambda o: (o.__setitem__(slice(None, None, 2), g), o)[1])(
             np.zeros_like(v))),
    ]
    for row in out:
        row[2][:] = [np.ascontiguousarray(v) for v in row[2]]
    return out, g0


# --- timing --------------------------------------------------------------------------------

def _best_time(fn, repeat, target=0.005):
    """Best over ``repeat`` runs of the mean time of enough calls to last ``target`` seconds."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(target / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def measure(repeat=5, only=None, seed=0):
    """Time every case forward and VJP; a list of result rows (dicts)."""
    import fastlib
    from fastlib.ops import bind

    rng = np.random.default_rng(seed)
    rows = []
    table, _ = cases(rng)
    for label, name, inputs, params, np_fwd, np_vjp in table:
        if only and name not in only and label not in only:
            continue
        out = fastlib.forward(name, inputs, **params)
        g = rng.standard_normal(out.shape).astype(F32)
        bound = bind(name, inputs, **params)
        timings = {
            "forward": (_best_time(bound.forward, repeat),
                        _best_time(lambda: fastlib.forward(name, inputs, **params), repeat),
                        _best_time(lambda: np_fwd(*inputs), repeat)),
            "vjp": (_best_time(lambda: bound.vjp(g, check=False), repeat),
                    _best_time(lambda: fastlib.vjp(name, inputs, g, **params), repeat),
                    _best_time(lambda: np_vjp(*inputs, g), repeat)),
        }
        shape = " ".join("x".join(map(str, v.shape)) or "()" for v in inputs)
        for direction, (t_kernel, t_api, t_np) in timings.items():
            rows.append({"case": label, "op": name, "direction": direction, "shapes": shape,
                         "dtype": "float32", "kernel_ms": t_kernel * 1e3,
                         "api_ms": t_api * 1e3, "numpy_ms": t_np * 1e3,
                         "ratio": t_kernel / t_np, "api_ratio": t_api / t_np})
    return rows


_STARTUP = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import fastlib
t1 = time.perf_counter()
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 784)).astype(np.float32)
w = rng.standard_normal((784, 128)).astype(np.float32)
b = np.zeros(128, np.float32)
z = fastlib.forward("matmul", [x, w]); a = fastlib.forward("add", [z, b])
y = fastlib.forward("relu", [a]); g = np.ones_like(y)
(ga,) = fastlib.vjp("relu", [a], g); gz, gb = fastlib.vjp("add", [z, b], ga)
gx, gw = fastlib.vjp("matmul", [x, w], gz)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_step_s": t2 - t1}))
"""


def startup_times():
    """Cold and warm start (import + first Dense-like step) in fresh subprocesses."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = {}
    with tempfile.TemporaryDirectory(prefix="verigrad-numba-cache-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache,
                   PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for label in ("cold", "warm"):
            proc = subprocess.run([sys.executable, "-c", _STARTUP], env=env, cwd=root,
                                  capture_output=True, text=True, check=True)
            result[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def render(rows, startup=None):
    """The table as text."""
    head = (f"{'case':40s} {'dir':7s} {'kernel ms':>10s} {'api ms':>9s} {'numpy ms':>9s} "
            f"{'ratio':>6s} {'api':>6s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        flag = "" if r["ratio"] <= 1 else "  slower"
        lines.append(f"{r['case']:40s} {r['direction']:7s} {r['kernel_ms']:10.4f} "
                     f"{r['api_ms']:9.4f} {r['numpy_ms']:9.4f} {r['ratio']:6.2f} "
                     f"{r['api_ratio']:6.2f}{flag}")
    slower = [r for r in rows if r["ratio"] > 1]
    lines.append("-" * len(head))
    lines.append(f"{len(rows)} rows; kernel slower than NumPy in {len(slower)}. ratio = kernel "
                 f"time / NumPy time (inputs validated once, fastlib.ops.bind); api = "
                 f"fastlib.forward / vjp with validation, over NumPy; float32")
    if startup:
        for label in ("cold", "warm"):
            s = startup[label]
            lines.append(f"{label} start: import fastlib {s['import_s']:.3f} s, first Dense "
                         f"step (forward + VJP) {s['first_step_s']:.3f} s")
    return "\n".join(lines)


def add_arguments(parser):
    """Options of ``verigrad bench ops``."""
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    parser.add_argument("--repeat", type=int, default=15,
                        help="timing repeats per measurement; the best is kept (default 15)")
    parser.add_argument("--only", nargs="+", metavar="OP",
                        help="benchmark only these ops (names or case labels)")
    parser.add_argument("--no-startup", action="store_true",
                        help="skip the cold / warm start measurement (two subprocesses)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for the parallel kernels (default: the idle cores)")


def run(args) -> int:
    """Run the benchmark, print the table, write JSON if asked; exit code 0."""
    import numba

    from fastlib import config

    if args.threads:
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        config.THREADS = args.threads
    rows = measure(repeat=max(1, args.repeat), only=set(args.only) if args.only else None)
    startup = None if args.no_startup else startup_times()
    print(render(rows, startup))
    if args.json:
        meta = {"threads": args.threads or "idle cores (adaptive)",
                "numba_threads": numba.get_num_threads(),
                "loadavg": open("/proc/loadavg").read().split()[:4]
                if os.path.exists("/proc/loadavg") else None}
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "startup": startup, "meta": meta}, fh, indent=2)
    return 0
