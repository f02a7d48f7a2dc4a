"""Tests of fastlib.cuda, the CUDA engine.

Three parts:

1. Under numba's CUDA simulator, in one subprocess (tests/cuda_sim_check.py; the variable
   NUMBA_ENABLE_CUDASIM=1 must be in the environment before numba is imported, and this pytest
   process may already have imported numba without it): every op forward and VJP in float32
   and float64 against exact values, the kink conventions, the device-function twins against
   the CPU scalars, the fused optimizer kernel against DataCode's formulas and fastlib.optim,
   and the Dense layer against NumPy. Each reported check is one test here; the tolerance of
   each is derived in that script.
2. Without a GPU and without the simulator (another subprocess): ``is_available()`` is False,
   the reason is the documented line, and every entry point raises the RuntimeError with it.
3. In this process: the op table against the registry, and validation (bad names, shapes,
   params, dtypes, non-finite values, domains) that raises before any device is touched.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlib.cuda as fc
from fastlib.cuda import ops as cuda_ops
from tests.sim_runs import (assert_only_known, assert_passed, load_script, once_per_run,
                             run_python, simulate)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIM_SCRIPT = ROOT / "tests" / "cuda_sim_check.py"
SIM_CHECKS = load_script(SIM_SCRIPT).check_names()


# ---------------------------------------------------------------------------------------------
# 1. the simulator

@pytest.fixture(scope="module")
def sim_results():
    """Run every simulator check once per test run; {check name: (ok, detail)}."""
    return once_per_run("cuda_sim_check", lambda: simulate(SIM_SCRIPT))


@pytest.mark.parametrize("check", SIM_CHECKS)
def test_simulated(sim_results, check):
    assert_passed(sim_results, check, SIM_SCRIPT)


def test_simulator_reports_only_known_checks(sim_results):
    assert_only_known(sim_results, SIM_CHECKS)


# ---------------------------------------------------------------------------------------------
# 2. no GPU, no simulator

_NO_DEVICE = r"""
import json, sys
import numpy as np
import fastlib.cuda as fc
from fastlib.cuda import ops as cuda_ops
from fastlib.cuda import dense, ops, optim  # importing the kernel modules needs no device
x = np.ones((2, 3))
calls = {
    "forward": lambda: fc.forward("tanh", [x]),
    "vjp": lambda: fc.vjp("add", [x, x], x),
    "dense_forward": lambda: fc.dense_forward(x, np.ones((3, 2)), np.ones(2), "relu"),
    "dense_backward": lambda: fc.dense_backward(np.ones((2, 2)), x, np.ones((3, 2)),
                                                np.ones((2, 2)), "relu"),
    "optimizer_update": lambda: fc.optimizer_update("Adam", {"w": x}, {"w": x},
                                                    fc.optimizer_init("Adam", {"w": x})),
    "to_device": lambda: fc.to_device(x),
}
errors = {}
for name, call in calls.items():
    try:
        call()
        errors[name] = None
    except Exception as e:
        errors[name] = [type(e).__name__, isinstance(e, RuntimeError), str(e)]
print(json.dumps({"available": fc.is_available(), "reason": fc.unavailable_reason(),
                  "errors": errors, "sympy": "sympy" in sys.modules}))
"""


def test_without_gpu_or_simulator_everything_says_why():
    proc = run_python(_NO_DEVICE, {}, drop=("NUMBA_ENABLE_CUDASIM",))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["available"]:
        pytest.skip("a CUDA GPU is present: the no-device path cannot be exercised here")
    # the fixed sentence, then numba's own word on the driver when it has one
    assert report["reason"].startswith("no CUDA GPU found (numba.cuda.is_available() is "
                                       "False); set NUMBA_ENABLE_CUDASIM=1 to run the simulator")
    assert "\n" not in report["reason"]
    for name, error in report["errors"].items():
        assert error is not None, f"{name} ran without a device"
        kind, is_runtime, message = error
        assert kind == "CudaUnavailableError" and is_runtime, (name, error)
        assert report["reason"] in message, (name, message)
    assert not report["sympy"], "fastlib.cuda must not import sympy"


def test_simulator_requested_too_late_is_explained():
    code = ("import os, numba; os.environ['NUMBA_ENABLE_CUDASIM'] = '1'; "
            "import fastlib.cuda as fc; print(fc.is_available()); print(fc.unavailable_reason())")
    proc = run_python(code, {}, drop=("NUMBA_ENABLE_CUDASIM",))
    assert proc.returncode == 0, proc.stderr
    available, reason = proc.stdout.strip().splitlines()[-2:]
    if available == "True":
        pytest.skip("a CUDA GPU is present")
    assert "imported before" in reason and "NUMBA_ENABLE_CUDASIM" in reason, reason


# ---------------------------------------------------------------------------------------------
# 3. the table and validation (no device needed: every error is raised before the device)

def test_op_table_matches_the_registry():
    import spec

    assert set(fc.OPS) == set(spec.OPS)
    for name, op in fc.OPS.items():
        registry = spec.OPS[name]
        assert op.inputs == tuple(registry.inputs), name
        declared = {p.name: p.default for p in registry.params}
        assert set(op.params) == set(declared), name
        for pname, default in op.params.items():
            if default is not cuda_ops.REQUIRED:
                assert default == declared[pname], (name, pname)


X = np.linspace(-1, 1, 6).reshape(2, 3)
BAD_CALLS = [
    # (description, call, exception, fragment of the message)
    ("unknown op, close match", lambda: fc.forward("tanhh", [X]), KeyError, "did you mean 'tanh'"),
    ("unknown param", lambda: fc.forward("sum", [X], axes=0), ValueError, "did you mean 'axis'"),
    ("input count", lambda: fc.forward("add", [X]), ValueError, "takes 2 input(s)"),
    ("inputs not a sequence", lambda: fc.forward("exp", X), TypeError, "sequence of arrays"),
    ("int dtype", lambda: fc.forward("exp", [np.arange(3)]), TypeError, "float32 or float64"),
    ("mixed dtypes", lambda: fc.forward("add", [X, X.astype(np.float32)]), TypeError,
     "mix float64 and float32"),
    ("NaN", lambda: fc.forward("exp", [np.array([0.0, np.nan])]), ValueError, "non-finite"),
    ("Inf", lambda: fc.forward("relu", [np.array([np.inf])]), ValueError, "non-finite"),
    ("broadcast", lambda: fc.forward("mul", [X, np.ones(4)]), ValueError, "do not broadcast"),
    ("log domain", lambda: fc.forward("log", [X]), ValueError, "must be > 0"),
    ("sqrt vjp at 0", lambda: fc.vjp("sqrt", [np.zeros(2)], np.ones(2)), ValueError,
     "infinite at 0"),
    ("div by zero", lambda: fc.forward("div", [X, np.zeros(3)]), ValueError, "nonzero"),
    ("axis range", lambda: fc.forward("mean", [X], axis=2), ValueError, "out of range"),
    ("repeated axis", lambda: fc.forward("sum", [X], axis=(0, 0)), ValueError, "repeats"),
    ("keepdims type", lambda: fc.forward("sum", [X], keepdims=1), ValueError, "True or False"),
    ("empty reduce", lambda: fc.forward("sum", [np.ones((0, 2))]), ValueError, "empty"),
    ("matmul inner", lambda: fc.forward("matmul", [X, X]), ValueError, "inner dimensions"),
    ("matmul batch", lambda: fc.forward("matmul", [np.ones((2, 2, 3)), np.ones((3, 3, 2))]),
     ValueError, "batch shapes differ"),
    ("matmul 1-d", lambda: fc.forward("matmul", [np.ones(3), np.ones(3)]), ValueError,
     "2-D or batched"),
    ("transpose axes", lambda: fc.forward("transpose", [X], axes=(0, 0)), ValueError,
     "not a permutation"),
    ("reshape size", lambda: fc.forward("reshape", [X], shape=(4, 2)), ValueError,
     "cannot reshape"),
    ("reshape two -1", lambda: fc.forward("reshape", [X], shape=(-1, -1)), ValueError,
     "more than one -1"),
    ("reshape required", lambda: fc.forward("reshape", [X]), ValueError, "is required"),
    ("concat shapes", lambda: fc.forward("concat", [X, np.ones((3, 3))], axis=1), ValueError,
     "differ off axis"),
    ("slice step", lambda: fc.forward("slice", [X], step=0), ValueError, "step must be >= 1"),
    ("softmax 0-d", lambda: fc.forward("softmax", [np.array(1.0)]), ValueError, "0-d"),
    ("layer_norm eps", lambda: fc.forward("layer_norm", [X], eps=-1.0), ValueError, ">= 0"),
    ("layer_norm constant row", lambda: fc.forward("layer_norm", [np.ones((2, 3))], eps=0.0),
     ValueError, "normaliser is 0"),
    ("mse shapes", lambda: fc.forward("mse", [X, np.ones(3)]), ValueError, "same shape"),
    ("ce index range", lambda: fc.forward("cross_entropy", [X, np.array([0, 3])]), ValueError,
     "out of range"),
    ("ce one-hot given", lambda: fc.forward("cross_entropy", [X, np.eye(2, 3)]), ValueError,
     "categorical_cross_entropy"),
    ("ce fractional index", lambda: fc.forward("cross_entropy", [X, np.array([0.5, 1.0])]),
     ValueError, "whole-number"),
    ("cce shape", lambda: fc.forward("categorical_cross_entropy", [X, np.array([0.0, 1.0])]),
     ValueError, "cross_entropy"),
    ("bce p range", lambda: fc.forward("binary_cross_entropy", [X, X]), ValueError, "(0, 1)"),
    ("grad shape", lambda: fc.vjp("exp", [X], np.ones(3)), ValueError, "shaped like the output"),
    ("grad dtype", lambda: fc.vjp("exp", [X], np.ones((2, 3), np.float32)), TypeError,
     "cast the cotangent"),
    ("dense activation", lambda: fc.dense_forward(X, np.ones((3, 2)), None, "relux"), ValueError,
     "did you mean relu"),
    ("dense shapes", lambda: fc.dense_forward(X, np.ones((2, 2))), ValueError, "input width"),
    ("dense bias", lambda: fc.dense_forward(X, np.ones((3, 2)), np.ones(3)), ValueError,
     "bias has shape"),
    ("dense NaN", lambda: fc.dense_forward(np.full((1, 3), np.nan), np.ones((3, 2))), ValueError,
     "NaN"),
    ("optimizer name", lambda: fc.optimizer_update("Adamm", {}, {}, fc.optimizer_init("SGD", {})),
     ValueError, "did you mean 'Adam'"),
    ("optimizer keys", lambda: fc.optimizer_update("SGD", {"w": X}, {"v": X},
                                                  fc.optimizer_init("SGD", {"w": X})),
     ValueError, "different keys"),
    ("optimizer dtype", lambda: fc.optimizer_update("SGD", {"w": X}, {"w": X.astype(np.float32)},
                                                   fc.optimizer_init("SGD", {"w": X})),
     TypeError, "parameter's dtype"),
]


@pytest.mark.parametrize("description, call, exc, fragment", BAD_CALLS,
                         ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_rejected_before_the_device(description, call, exc, fragment):
    with pytest.raises(exc) as info:
        call()
    assert not isinstance(info.value, fc.CudaUnavailableError)
    assert fragment in str(info.value), str(info.value)


@st.composite
def axis_calls(draw):
    """A shape and an axis argument for a reduction: an int, None or a tuple, valid or not."""
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    ndim = len(shape)
    axis = draw(st.one_of(st.none(), st.integers(-4, 4),
                          st.lists(st.integers(-4, 4), min_size=1, max_size=3).map(tuple)))
    return shape, axis


@settings(max_examples=20)
@given(axis_calls())
def test_reduction_axis_validation_matches_numpy(call):
    shape, axis = call
    x = np.ones(shape)
    try:
        expected = np.sum(x, axis=axis).shape
    except (ValueError, np.exceptions.AxisError):
        expected = None
    try:
        got = fc.forward("sum", [x], axis=axis).shape
    except fc.CudaUnavailableError:
        got = "valid"  # validated and accepted; no device to run on
    except ValueError:
        got = None
    if expected is None:
        assert got is None, f"axis={axis!r} on {shape} should be rejected"
    else:
        assert got in ("valid", expected), (shape, axis, got, expected)


_BROKEN_IMPORT = """
import sys
sys.modules["numba.cuda"] = None        # numba.cuda cannot be imported (as with NumPy 2.5)
import numpy as np
import fastlib.cuda as fc
print("AVAILABLE", fc.is_available())
print("REASON", fc.unavailable_reason())
try:
    fc.forward("add", [np.ones(1), np.ones(1)])
    print("NO ERROR")
except fc.CudaUnavailableError as exc:
    print("RAISED", exc)
"""


def test_a_failed_cuda_import_names_the_package_and_the_fix():
    proc = run_python(["-c", _BROKEN_IMPORT], {}, drop=("NUMBA_ENABLE_CUDASIM",))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["AVAILABLE"] == "False"
    assert "import numba.cuda failed" in lines["REASON"]
    assert "pip install 'verigrad[cuda]'" in lines["REASON"]
    assert "import numba.cuda failed" in lines["RAISED"]


def test_the_row_stack_failure_says_which_numpy_and_what_to_install():
    from fastlib.cuda.device import import_failure_reason
    reason = import_failure_reason(
        AttributeError("module 'numpy' has no attribute 'row_stack'"))
    assert "removed numpy.row_stack" in reason and "numpy<2.5" in reason


_BRIDGE = r"""
import os, sys, tempfile
import numpy as np
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "fake_overloads.py"), "w") as fh:
    # what numba-cuda 0.30's array overloads do at import: read numpy.row_stack
    fh.write("import numpy as np\nREGISTERED = np.row_stack\n")
sys.path.insert(0, folder)
had = hasattr(np, "row_stack")
if had:
    del np.row_stack                    # NumPy 2.5 as shipped
from fastlib.cuda import compat
compat.ROW_STACK_MODULE = "fake_overloads"
line = compat.bridge_row_stack()
import fake_overloads
print("REGISTERED_IS_VSTACK", fake_overloads.REGISTERED is np.vstack)
print("ROW_STACK_AFTER", hasattr(np, "row_stack"))
print("AGAIN_SAME", compat.bridge_row_stack() == line)
print("LINE", line)
"""


def test_the_row_stack_bridge_imports_the_one_module_and_leaves_numpy_as_shipped():
    proc = run_python(["-c", _BRIDGE], {}, drop=("NUMBA_ENABLE_CUDASIM",))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["REGISTERED_IS_VSTACK"] == "True"   # the module saw row_stack = vstack
    assert lines["ROW_STACK_AFTER"] == "False"       # and NumPy lacks it again afterwards
    assert lines["AGAIN_SAME"] == "True"
    assert "numpy.row_stack = numpy.vstack for its import only" in lines["LINE"]


def test_a_first_compile_on_a_gpu_prints_one_line(monkeypatch, capsys):
    from fastlib.cuda import device
    monkeypatch.setattr(device.config, "SIMULATOR", False)  # as on a GPU
    monkeypatch.setattr(device, "_NOTICED", [False])
    device._notice()
    device._notice()  # a later compile of the same process says nothing
    err = capsys.readouterr().err
    assert err == device.COMPILE_NOTICE + "\n"
    assert "first launch" in err and "cache" in err


def test_the_simulator_prints_no_compile_line(monkeypatch, capsys):
    from fastlib.cuda import device
    monkeypatch.setattr(device.config, "SIMULATOR", True)
    monkeypatch.setattr(device, "_NOTICED", [False])
    device._notice()
    assert capsys.readouterr().err == ""
