"""Corrupt real model and checkpoint files thousands of ways and load every one (a script).

    python tests/file_fuzz.py --cases 2000 --seed 0 --memory-mb 1024

Run by ``tests/test_file_fuzz.py`` in a subprocess, under an address-space limit
(``resource.setrlimit(RLIMIT_AS)``: this process's size after its imports plus ``--memory-mb``),
so a loader that allocated what a hostile header declares would die of ``MemoryError`` and be
counted. Prints one JSON line: case counts per corruption kind and outcome, the slowest load,
and every case whose outcome broke the contract. The contract, per case:

- a clean refusal: ``fastlib.errors.CorruptFileError`` whose message contains the file's path;
- or a correct result: the loaded model's parameter names, dtypes and values are exactly those
  of the file the corruption started from (no corruption here changes a stored weight without
  also breaking its CRC, so a changed weight that loads is a failure).

Anything else (another exception type, a message without the path, a changed model) is a failure.

Corruptions, drawn from the seed: byte flips (1-8 bytes anywhere), truncations, zip member edits
(removed, duplicated, renamed, replaced by noise, re-compressed, an extra member, the ``.npy``
header's shape, dtype or order rewritten) and metadata JSON edits (deep nesting, a number / list
/ string / null instead of the object, ``"dtype": null`` and other dtypes, unknown layer types,
huge, negative, fractional, boolean or string sizes such as ``Dense(25000, 25000)``, parameter
lists changed, any value in the tree replaced by a random one).
"""
from __future__ import annotations

import argparse
import io as pyio
import json
import os
import pathlib
import sys
import tempfile
import time
import zipfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KINDS = ("flip", "truncate", "member", "header", "json")

# values a JSON edit may put anywhere in the metadata tree
ODD_VALUES = [None, True, False, 0, -1, 1, 2.5, -0.0, 1e308, 10 ** 30, 25000, 2 ** 31,
              2 ** 63, "", "float16", "relu", "Dense", "x" * 300, [], {}, [1, 2], {"type": 5},
              {"type": "Dense"}, {"type": "Sequential", "layers": 3},
              float("nan"), float("inf")]


def _models():
    import fastlib
    from fastlib.rbm import RBM

    f32, f64 = np.float32, np.float64
    return {
        "mlp": fastlib.Sequential([fastlib.Dense(6, 8, "relu"), fastlib.Dense(8, 3)],
                                  dtype=f32, seed=1),
        "nested": fastlib.Sequential([fastlib.Dense(5, 4, "tanh"), fastlib.Sequential(
            [fastlib.LayerNorm(4), fastlib.Dense(4, 2)])], dtype=f64, seed=2),
        "lstm": fastlib.Sequential([fastlib.LSTM(3, 4), fastlib.Dense(4, 2)], dtype=f64, seed=3),
        "attention": fastlib.Sequential([fastlib.Embedding(7, 8), fastlib.MultiHeadAttention(
            8, 2, causal=True), fastlib.RMSNorm(8), fastlib.SwiGLU(8, 6, 4)], dtype=f32, seed=4),
        "parallel": fastlib.Parallel([fastlib.Dense(3, 2), fastlib.RNN(3, 2)], combine="concat",
                                     dtype=f32, seed=5),
        "rbm": RBM(6, 4, seed=6),
    }


def make_originals(folder):
    """Save every model, and one training checkpoint; return {name: (path, parameters)}."""
    out = {}
    for name, model in _models().items():
        path = model.save(pathlib.Path(folder) / f"{name}.npz")
        out[name] = (path, {k: v.copy() for k, v in model.parameters().items()})
    # a checkpoint as train() writes it, built directly (no kernel needs compiling here)
    from fastlib import optim
    from fastlib.training import checkpoint

    model = _models()["mlp"]
    opt = optim.get("Adam")
    state = opt.init(model.parameters())
    for slots in state.slots.values():
        for name, arr in slots.items():
            arr[...] = np.linspace(-1, 1, arr.size).reshape(arr.shape)
    ck = pathlib.Path(folder) / "checkpoint.npz"
    checkpoint.save_checkpoint(ck, model, checkpoint.Checkpoint(
        epoch=1, params={}, optimizer=opt.get_config(), opt_state=state,
        rng_state=np.random.default_rng(0).bit_generator.state,
        history={"loss": [1.0], "acc": [0.5], "val_loss": [], "val_acc": [],
                 "epoch_times": [0.1], "lr": [0.01], "skipped": 0, "fused": False,
                 "stopped": False, "stop_reason": None},
        lr=0.01, step=3, config={"seed": 0}, best_params=None))
    out["checkpoint"] = (ck, {k: v.copy() for k, v in model.parameters().items()})
    return out


# ---------------------------------------------------------------------------------------------
# corruptions: each takes the original bytes and a Generator, returns (bytes, description)

def _members(data):
    with zipfile.ZipFile(pyio.BytesIO(data)) as z:
        return [(i, z.read(i.filename)) for i in z.infolist()]


def _zip(entries):
    import warnings

    buf = pyio.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as z:
        warnings.simplefilter("ignore", UserWarning)  # duplicated names are the point
        for name, payload, method in entries:
            z.writestr(zipfile.ZipInfo(name), payload, compress_type=method)
    return buf.getvalue()


def flip(data, rng):
    out = bytearray(data)
    n = int(rng.integers(1, 9))
    where = rng.integers(0, len(out), n)
    for i in where:
        out[i] ^= int(rng.integers(1, 256))
    return bytes(out), f"flip {n} byte(s) at {sorted(int(i) for i in where)[:8]}"


def truncate(data, rng):
    n = int(rng.integers(0, len(data)))
    return data[:n], f"truncate to {n} of {len(data)} bytes"


def member(data, rng):
    entries = [(i.filename, payload, zipfile.ZIP_STORED) for i, payload in _members(data)]
    k = int(rng.integers(0, len(entries)))
    name = entries[k][0]
    op = int(rng.integers(0, 6))
    if op == 0:
        del entries[k]
        what = f"remove {name}"
    elif op == 1:
        entries.append(entries[k])
        what = f"duplicate {name}"
    elif op == 2:
        entries[k] = (name.replace(".npy", ".txt") if rng.random() < 0.5 else
                      "param/nosuch.npy", entries[k][1], entries[k][2])
        what = f"rename {name} to {entries[k][0]}"
    elif op == 3:
        noise = rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8).tobytes()
        entries[k] = (name, noise, entries[k][2])
        what = f"replace {name} by {len(noise)} random bytes"
    elif op == 4:
        entries = [(n, p, zipfile.ZIP_DEFLATED) for n, p, _ in entries]
        what = "re-compress every member (deflate)"
    else:
        extra = pyio.BytesIO()
        np.save(extra, np.zeros(int(rng.integers(0, 5))))
        entries.append((f"param/extra{int(rng.integers(0, 9))}.npy", extra.getvalue(),
                        zipfile.ZIP_STORED))
        what = "add an extra member"
    return _zip(entries), what


HEADER_EDITS = [
    ("shape", lambda s: "(25000, 25000)"), ("shape", lambda s: "(3000000000000000000,)"),
    ("shape", lambda s: "(-1, 2)"), ("shape", lambda s: "()"), ("shape", lambda s: "(2, 3, 4)"),
    ("shape", lambda s: "(4611686018427387904, 4)"), ("shape", lambda s: "'x'"),
    ("descr", lambda s: "'|O'"), ("descr", lambda s: "'<c16'"), ("descr", lambda s: "'|V8'"),
    ("descr", lambda s: "'>f4'"), ("descr", lambda s: "'<f2'"), ("descr", lambda s: "'<i8'"),
    ("descr", lambda s: "[('a', '<f4')]"), ("descr", lambda s: "'nonsense'"),
    ("fortran_order", lambda s: "True"), ("fortran_order", lambda s: "7"),
    (None, lambda s: "{'descr': '<f4', " + "(" * 300),
    (None, lambda s: "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}"),
    (None, lambda s: "[1, 2, 3]"), (None, lambda s: "{" * 5000),
]


def header(data, rng):
    """Rewrite one member's .npy header dict (same data after it)."""
    entries = [(i.filename, payload) for i, payload in _members(data)]
    k = int(rng.integers(0, len(entries)))
    name, payload = entries[k]
    hlen = int.from_bytes(payload[8:10], "little")
    text = payload[10:10 + hlen].decode("latin1")
    body = payload[10 + hlen:]
    key, edit = HEADER_EDITS[int(rng.integers(0, len(HEADER_EDITS)))]
    if key is None:
        new = edit(text)
    else:
        d = eval(text)  # noqa: S307 - the fuzzer's own, just-written header
        d[key] = "@@"
        new = repr(d).replace("'@@'", edit(d))
    raw = new.encode("latin1")
    pad = (-(10 + len(raw) + 1)) % 64
    raw = raw + b" " * pad + b"\n"
    if len(raw) < 65536:
        head = b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little")
    else:
        head = b"\x93NUMPY\x02\x00" + len(raw).to_bytes(4, "little")
    entries[k] = (name, head + raw + body)
    return _zip([(n, p, zipfile.ZIP_STORED) for n, p in entries]), f"header of {name}: {new[:60]}"


def _nest(depth, rng):
    """JSON text of an architecture nested ``depth`` deep (built as text: json.dumps recurses)."""
    text = '{"type": "Dense", "in_features": 1, "out_features": 1}'
    opens, closes = [], []
    for _ in range(depth):
        if rng.random() < 0.5:
            opens.append('{"type": "Sequential", "layers": [')
            closes.append("]}")
        else:
            opens.append("[")
            closes.append("]")
    return "".join(reversed(opens)) + text + "".join(closes)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _set(node, path, value):
    if not path:
        return value
    node[path[0]] = _set(node[path[0]], path[1:], value)
    return node


def json_edit(data, rng):
    entries = [(i.filename, payload) for i, payload in _members(data)]
    k = next(i for i, (n, _) in enumerate(entries) if n == "__meta__.npy")
    meta = json.loads(str(np.load(pyio.BytesIO(entries[k][1]))[()]))
    op = int(rng.integers(0, 8))
    text = None
    if op == 0:
        depth = int(rng.choice([50, 150, 1000, 5000]))
        meta["architecture"] = "@@"
        text = json.dumps(meta).replace('"@@"', _nest(depth, rng))
        what = f"architecture nested {depth} deep"
    elif op == 1:
        meta = ODD_VALUES[int(rng.integers(0, len(ODD_VALUES)))]
        what = f"metadata replaced by {json.dumps(meta)[:40]}"
    elif op == 2:
        meta["dtype"] = [None, "float16", "int64", 5, "float32 ", "object"][int(rng.integers(6))]
        what = f"dtype {json.dumps(meta['dtype'])}"
    elif op == 3:
        meta["architecture"] = {"type": "Dense", "in_features": 25000, "out_features": 25000}
        meta["parameters"] = ["weight", "bias"]
        what = "architecture Dense(25000, 25000)"
    elif op == 4:
        names = list(meta.get("parameters", []))
        rng.shuffle(names)
        meta["parameters"] = names[: int(rng.integers(0, len(names) + 1))] + (
            ["0.weight"] if rng.random() < 0.3 else [])
        what = f"parameters {names[:4]}"
    else:
        paths = list(_paths(meta))
        path = paths[int(rng.integers(0, len(paths)))]
        value = ODD_VALUES[int(rng.integers(0, len(ODD_VALUES)))]
        if op == 5 and isinstance(value, int) and not isinstance(value, bool):
            value = int(rng.choice([25000, 10 ** 9, 2 ** 40, -5, 0]))
        meta = _set(meta, path, value)
        what = f"{'.'.join(map(str, path)) or 'root'} = {json.dumps(value)[:40]}"
    buf = pyio.BytesIO()
    np.save(buf, np.array(text if text is not None else json.dumps(meta)))
    entries[k] = ("__meta__.npy", buf.getvalue())
    return _zip([(n, p, zipfile.ZIP_STORED) for n, p in entries]), what


CORRUPT = {"flip": flip, "truncate": truncate, "member": member, "header": header,
           "json": json_edit}


# ---------------------------------------------------------------------------------------------

def _limit_memory(extra_mb):
    import resource

    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = size + extra_mb * 2 ** 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def _same(model, params):
    got = model.parameters()
    return list(got) == list(params) and all(
        got[k].dtype == v.dtype and np.array_equal(got[k], v) for k, v in params.items())


def _stored(data, names, fallback):
    """The parameters as NumPy's own reader finds them in ``data`` (the original's otherwise).

    A corruption that leaves a valid file (a member re-compressed, an ``.npy`` header switched
    to Fortran order) defines new correct values; everything else must load the original's.
    """
    try:
        with np.load(pyio.BytesIO(data), allow_pickle=False) as z:
            return {k: z["param/" + k] for k in names}
    except Exception:  # noqa: BLE001
        return fallback


def run(cases, seed, memory_mb):
    import fastlib
    from fastlib.errors import CorruptFileError
    from fastlib.training import checkpoint

    folder = tempfile.mkdtemp(prefix="verigrad-fuzz-")
    originals = make_originals(folder)
    blobs = {name: path.read_bytes() for name, (path, _) in originals.items()}
    target = pathlib.Path(folder) / "corrupt.npz"
    limit = _limit_memory(memory_mb) if memory_mb else None
    rng = np.random.default_rng(seed)
    counts, failures, slowest = {}, [], (0.0, "")
    names = sorted(blobs)
    for i in range(cases):
        name = names[i % len(names)]
        kind = KINDS[(i // len(names)) % len(KINDS)]
        try:
            data, what = CORRUPT[kind](blobs[name], rng)
        except Exception as exc:  # noqa: BLE001 - the corruption itself failed: count it
            counts[f"{kind}/skipped"] = counts.get(f"{kind}/skipped", 0) + 1
            failures.append({"case": i, "file": name, "kind": kind, "what": "(not generated)",
                             "loader": "-", "detail": f"fuzzer: {type(exc).__name__}: {exc}"})
            continue
        target.write_bytes(data)
        loaders = [("load", fastlib.load)]
        if name == "checkpoint":
            loaders.append(("load_checkpoint", checkpoint.load_checkpoint))
        for loader_name, loader in loaders:
            t0 = time.perf_counter()
            outcome, detail = "error", ""
            try:
                result = loader(target)
                expected = _stored(data, list(originals[name][1]), originals[name][1])
                params = result.params if loader_name == "load_checkpoint" else None
                ok = (_same(result, expected) if params is None else
                      list(params) == list(expected) and all(
                          np.array_equal(params[k], v) for k, v in expected.items()))
                outcome = "loaded" if ok else "FAIL"
                detail = "" if ok else "loaded a model that differs from the file's"
            except CorruptFileError as exc:
                if str(target) not in str(exc):
                    outcome, detail = "FAIL", f"message without the file name: {exc}"
            except BaseException as exc:  # noqa: BLE001 - anything else breaks the contract
                outcome, detail = "FAIL", f"{type(exc).__name__}: {str(exc)[:300]}"
            dt = time.perf_counter() - t0
            if dt > slowest[0]:
                slowest = (dt, f"{name} {kind}: {what}")
            key = f"{kind}/{outcome}"
            counts[key] = counts.get(key, 0) + 1
            if outcome == "FAIL":
                failures.append({"case": i, "file": name, "kind": kind, "what": what,
                                 "loader": loader_name, "detail": detail})
    import resource

    return {"cases": cases, "seed": seed, "counts": counts, "failures": failures,
            "slowest_seconds": round(slowest[0], 4), "slowest_case": slowest[1],
            "memory_limit_bytes": limit,
            "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-mb", type=int, default=1024,
                        help="address space allowed beyond the size after imports (0: no limit)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.cases, args.seed, args.memory_mb)))


if __name__ == "__main__":
    main()
