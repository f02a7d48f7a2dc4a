"""Data-parallel training over MPI: ``train(..., distributed=True)`` under ``mpiexec -n K``.

Every rank runs the same ``train`` call on the same data with the same seed. Rank 0's
parameters, optimizer state and Generator are broadcast at the start (so a checkpoint written
with any number of ranks resumes with any other); every rank then draws the same sample order
and builds the same global batches (the batch size is the user's), and each rank trains on its
own share of every batch. Gradients are summed across ranks before the optimizer step, which
every rank then applies to identical gradients, so every rank holds the same parameters after
every step. Only rank 0 shows progress and writes checkpoints.

The long story: docs/fastlib.md, section ``fastlib/training/distributed.py``.
"""
from __future__ import annotations

import math
import os
import socket
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import numpy as np

from fastlib.training.algorithms import (EVAL_CHUNK, Algorithm, BatchResult, correct_count,
                                         evaluate_model)
from fastlib.training.clipping import clip_gradients

__all__ = ["DataParallel", "INSTALL_HINT", "UNSUPPORTED", "batch_blocks", "block_bounds",
           "check_ranks", "rank_blocks", "tree_nodes", "tree_sum", "resolve", "world"]

INSTALL_HINT = ("install the MPI extra: pip install 'verigrad[mpi]' (mpi4py and the mpich "
                "wheel, which brings mpiexec), then launch with: mpiexec -n K python your_script.py"
                " (or: mpiexec -n K verigrad train --distributed)")

# algorithm -> why it does not run data-parallel
UNSUPPORTED = {
    "targetprop": "its layer-local updates are not the gradient of a mean over the batch (the "
                  "targets of a batch depend on the whole batch's activations), so summing "
                  "per-rank updates would not reproduce the one-process step",
    "cd": "each step draws its Gibbs samples from the run's Generator in the batch's shape; "
          "splitting the batch across ranks would change the random stream, so the result "
          "would not equal the one-process run",
}


@dataclass(frozen=True)
class DataParallel:
    """Options of a data-parallel run (``train(..., distributed=DataParallel(...))``).

    Attributes
    ----------
    blocks : int
        Blocks per global batch (at most the batch size): the unit of work and of the fixed
        summation order. The number of ranks must divide it (then every batch's shards differ
        by at most one sample); more blocks allow more ranks but cost one small
        forward/backward each.
    timeout : float
        Seconds a rank waits in a collective for the others before it names the silent ranks
        and aborts the job.
    """

    blocks: int = 8
    timeout: float = 120.0

    def __post_init__(self):
        if isinstance(self.blocks, bool) or not isinstance(self.blocks, (int, np.integer)) or \
                self.blocks < 1:
            raise ValueError(f"DataParallel.blocks must be an int >= 1, got {self.blocks!r}")
        if not (isinstance(self.timeout, (int, float)) and math.isfinite(self.timeout)
                and self.timeout > 0):
            raise ValueError(f"DataParallel.timeout must be a number of seconds > 0, got "
                             f"{self.timeout!r}")


def resolve(distributed):
    """``distributed`` as a :class:`DataParallel` (or None when it is False / None)."""
    if distributed is None:
        return None
    if isinstance(distributed, (bool, np.bool_)):     # NumPy's flags are flags too
        return DataParallel() if distributed else None
    if isinstance(distributed, DataParallel):
        return distributed
    raise TypeError(f"distributed must be True, False or a DataParallel(blocks=..., timeout=...)"
                    f", got {type(distributed).__name__}")


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(f"distributed=True needs mpi4py and an MPI library ({exc}); "
                          f"{INSTALL_HINT}") from None
    return MPI


def world():
    """``(rank, size)`` of this process in ``MPI.COMM_WORLD`` ((0, 1) without mpiexec);
    ImportError with the install command when mpi4py is missing."""
    comm = _mpi().COMM_WORLD
    return comm.Get_rank(), comm.Get_size()


# ---------------------------------------------------------------------------------------------
# the fixed decomposition (pure functions of the batch, never of the number of ranks)

def block_bounds(n, m):
    """``[(lo, hi)]`` of ``m`` near-equal blocks covering ``n`` samples (sizes differ by <= 1)."""
    return [((j * n) // m, ((j + 1) * n) // m) for j in range(m)]


def batch_blocks(n, blocks):
    """How many blocks a batch of ``n`` samples is cut into: ``blocks``, or one sample per
    block when the batch is smaller."""
    return min(blocks, n)


def check_ranks(blocks, k):
    """ValueError unless ``k`` ranks divide ``blocks`` (what keeps every batch's shards within
    one sample of each other); the message gives the fix."""
    if blocks % k:
        fit = blocks + (-blocks) % k
        raise ValueError(f"{k} MPI ranks do not divide the {blocks} blocks per batch, so the "
                         f"ranks' shards would differ by whole blocks: pass DataParallel("
                         f"blocks={fit}) (any multiple of {k}; verigrad train: --blocks {fit}), "
                         "and the same blocks to any run you compare with")


def rank_blocks(m, k, r):
    """The run of blocks ``[a, b)`` that rank ``r`` of ``k`` owns among ``m`` blocks."""
    return (r * m) // k, ((r + 1) * m) // k


def tree_nodes(lo, hi, a, b):
    """The largest nodes of the summation tree over ``[lo, hi)`` that lie inside ``[a, b)``.

    The tree splits ``[lo, hi)`` at ``(lo + hi) // 2``; the nodes are returned left to right.
    """
    if a >= b or b <= lo or a >= hi:
        return []
    if a <= lo and hi <= b:
        return [(lo, hi)]
    mid = (lo + hi) // 2
    return tree_nodes(lo, mid, a, b) + tree_nodes(mid, hi, a, b)


def tree_sum(values, lo, hi):
    """The sum over the tree node ``[lo, hi)`` from ``values`` (node -> array) that cover it.

    A node present in ``values`` is taken as is; otherwise its two children are summed, left
    plus right. Floating-point addition is commutative, so every rank that combines the same
    nodes gets the same bits.
    """
    if (lo, hi) in values:
        return values[(lo, hi)]
    if hi - lo <= 1:
        raise KeyError(f"tree_sum: block {lo} is not covered")
    mid = (lo + hi) // 2
    return tree_sum(values, lo, mid) + tree_sum(values, mid, hi)


# ---------------------------------------------------------------------------------------------
# the communicator with timeouts

class _Comm:
    """MPI collectives that never block forever (polled against a deadline)."""

    PING_TAG = 7177

    def __init__(self, timeout):
        MPI = _mpi()
        self.MPI = MPI
        world = MPI.COMM_WORLD
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.timeout = float(timeout)
        self.on_abort = None
        # the run's collectives and the liveness pings each get their own communicator, so
        # neither can match the other's messages (nor a user's on COMM_WORLD)
        self.ping = None  # no pings until both communicators exist (see _silent_ranks_abort)
        self.comm, req = world.Idup()
        self._wait(req, "start-up (duplicating the communicator)")
        ping, req = world.Idup()
        self._wait(req, "start-up (duplicating the communicator)")
        self.ping = ping

    def _wait(self, req, what):
        deadline = time.monotonic() + self.timeout
        spins = 0
        while not req.Test():
            spins += 1
            if spins > 2000:  # after the first few ms, poll gently
                time.sleep(2e-4)
                if time.monotonic() > deadline:
                    self._silent_ranks_abort(what)

    def abort(self, code):
        """``MPI_Abort`` after ``on_abort`` (the session claims the failure for this rank)."""
        if self.on_abort is not None:
            self.on_abort()
        # NOTE: mpiexec relays a rank's output through its own pipes and drops what it has not
        # relayed yet when the job is torn down: flush, and give it a moment, so the message
        # naming the failed rank is never the part that is lost (seen on a loaded machine).
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_GRACE)
        self.MPI.COMM_WORLD.Abort(code)

    def _silent_ranks_abort(self, what):
        """Name the ranks that do not answer a ping, then abort the job (never hang)."""
        # at start-up (no ping communicator yet) the pings go over COMM_WORLD on their own tag
        ping = self.ping if self.ping is not None else self.MPI.COMM_WORLD
        others = [r for r in range(self.size) if r != self.rank]
        mark = np.zeros(1, np.int64)
        inbox = {r: np.zeros(1, np.int64) for r in others}
        recvs = {r: ping.Irecv(inbox[r], source=r, tag=self.PING_TAG) for r in others}
        for r in others:
            ping.Isend(mark, dest=r, tag=self.PING_TAG)
        grace = time.monotonic() + min(10.0, max(2.0, self.timeout / 2))
        while time.monotonic() < grace and not all(q.Test() for q in recvs.values()):
            time.sleep(1e-3)
        silent = [r for r, q in recvs.items() if not q.Test()]
        if silent and self.ping is None:
            who = (f"no answer from rank(s) {', '.join(map(str, silent))}, which did not reach "
                   "the start of train(..., distributed=True) (failed before it, hang, or run "
                   "another call)")
        elif silent:
            who = f"no answer from rank(s) {', '.join(map(str, silent))}"
        else:
            who = ("every rank answers a ping but the collective did not complete (ranks out "
                   "of step: do all of them run the same train call?)")
        _report(f"rank {self.rank} of {self.size} waited {self.timeout:g} s in {what}: {who} "
                f"(a rank died, hangs or left training); aborting every rank")
        self.abort(3)

    def bcast_obj(self, obj, what):
        """Rank 0's ``obj`` on every rank (pickled; its length first, then the bytes)."""
        import pickle

        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if self.rank == 0 else b""
        length = np.array([len(data)], np.int64)
        self._wait(self.comm.Ibcast(length, root=0), what)
        buf = np.frombuffer(data, np.uint8).copy() if self.rank == 0 else \
            np.empty(int(length[0]), np.uint8)
        self._wait(self.comm.Ibcast(buf, root=0), what)
        return obj if self.rank == 0 else pickle.loads(buf.tobytes())

    def allreduce_sum(self, arr, what):
        out = np.empty_like(arr)
        self._wait(self.comm.Iallreduce(arr, out, op=self.MPI.SUM), what)
        return out

    def alltoallv(self, send, sendcounts, recv, recvcounts, what):
        sd = np.concatenate([[0], np.cumsum(sendcounts)[:-1]]).astype(np.int64)
        rd = np.concatenate([[0], np.cumsum(recvcounts)[:-1]]).astype(np.int64)
        mtype = _mpi_type(send.dtype)
        self._wait(self.comm.Ialltoallv([send, (list(sendcounts), list(sd)), mtype],
                                        [recv, (list(recvcounts), list(rd)), mtype]), what)

    def allgatherv(self, send, recv, counts, what):
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        mtype = _mpi_type(send.dtype)
        self._wait(self.comm.Iallgatherv([send, mtype],
                                         [recv, (list(counts), list(displs)), mtype]), what)


def _mpi_type(dtype):
    from mpi4py.util.dtlib import from_numpy_dtype

    return from_numpy_dtype(dtype)


# seconds a rank waits between writing its failure message and MPI_Abort (see _Comm.abort)
ABORT_GRACE = 0.5

def _report(message):
    sys.stderr.write(f"verigrad distributed: {message}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# the session attached to one training run

class _Session:
    """One data-parallel run: the communicator, the wrapped algorithm and the exchanges."""

    def __init__(self, ctx, options):
        self.options = options
        self.comm = _Comm(options.timeout)
        self.rank, self.size = self.comm.rank, self.comm.size
        self.ctx = ctx
        self.names = list(ctx.params)
        self.algo = None  # the run's algorithm, wrapped (attach sets it)
        self.step_index = 0

    # -- start-up ------------------------------------------------------------------------------
    def broadcast_state(self):
        """Rank 0's parameters, optimizer state, Generator, step and rate, to every rank."""
        ctx = self.ctx
        state = None
        if self.rank == 0:
            state = {"params": {k: np.array(v) for k, v in ctx.params.items()},
                     "opt_t": ctx.opt_state.t, "slots": ctx.opt_state.slots,
                     "rng": ctx.rng.bit_generator.state, "step": ctx.step, "lr": ctx.lr,
                     "algo_state": ctx.state,
                     # names this run's failure claims (rank_sentinel): one file per host
                     "token": f"{os.getpid()}-{os.urandom(6).hex()}"}
        state = self.comm.bcast_obj(state, "the start-up broadcast of rank 0's state")
        if self.rank != 0:
            for k, v in ctx.params.items():
                np.copyto(v, state["params"][k])
            ctx.opt_state.t = state["opt_t"]
            for s, d in state["slots"].items():
                for k, v in d.items():
                    np.copyto(ctx.opt_state.slots[s][k], v)
            ctx.rng.bit_generator.state = state["rng"]
            ctx.step, ctx.lr, ctx.state = state["step"], state["lr"], dict(state["algo_state"])
        self.token = state["token"]
        self.hosts, self.pids = self._identities()
        self.claim_path = os.path.join(tempfile.gettempdir(),
                                       f"verigrad-dp-{self.token}.first-failure")
        self.sentinel = None
        if self.size > 1:
            from fastlib.training.rank_sentinel import Sentinel

            host = self.hosts[self.rank]
            peers = [int(p) for r, p in enumerate(self.pids)
                     if r != self.rank and self.hosts[r] == host]
            self.sentinel = Sentinel(self.rank, self.size, host, self.claim_path, peers)
        self.comm.on_abort = self.claim_failure

    def _identities(self):
        """Every rank's ``(host, pid)``: each rank fills its own row, the sum gathers them."""
        width = 256
        rows = np.zeros((self.size, width + 1), np.int64)
        name = socket.gethostname().encode()[:width]
        rows[self.rank, :len(name)] = np.frombuffer(name, np.uint8)
        rows[self.rank, width] = os.getpid()
        rows = self.comm.allreduce_sum(rows, "the start-up exchange of hosts and process ids")
        hosts = [bytes(r[:width][r[:width] > 0].astype(np.uint8)).decode(errors="replace")
                 for r in rows]
        return hosts, [int(p) for p in rows[:, width]]

    def claim_failure(self):
        """This rank reported the failure itself: claim it (so the sentinels of the ranks the
        abort kills stay quiet) and let this rank's sentinel go."""
        from fastlib.training.rank_sentinel import CLAIMED, claim

        if claim(self.claim_path, f"rank {self.rank} reported\n"):
            self.finish(CLAIMED)  # its sentinel removes the claim later
        self.finish()

    def finish(self, word=None):
        """Let this rank's sentinel go (training ended, or this rank reported a failure)."""
        if self.sentinel is not None:
            if word is None:
                self.sentinel.finish()
            else:
                self.sentinel.finish(word)
            self.sentinel = None

    def banner(self, fused_possible):
        """Rank 0's start-up line (ranks, hosts' PIDs, blocks, and the path taken)."""
        if self.rank != 0:
            return
        path = ("per-batch path (the fused whole-epoch MLP kernel runs a whole epoch inside one "
                "compiled call, but the gradients must be exchanged after every step)"
                if fused_possible else "per-batch path")
        pids = ", ".join(f"rank {r}: pid {p} on {h}"
                         for r, (h, p) in enumerate(zip(self.hosts, self.pids)))
        _report(f"data-parallel on {self.size} rank(s) ({pids}); {self.options.blocks} blocks "
                f"per batch; {path}")

    # -- the step -------------------------------------------------------------------------------
    def wrap(self, algo):
        """``algo`` with a data-parallel ``train_one_batch`` and a sharded ``evaluate``."""
        evaluate = algo.evaluate
        if evaluate is None or evaluate is evaluate_model:
            evaluate = self.evaluate
        return Algorithm(algo.name, self.train_one_batch, algo.needs_targets, algo.init,
                         evaluate, None, algo.options)

    def _flat(self, grads, dtype):
        return np.concatenate([np.ascontiguousarray(grads[k], dtype=dtype).reshape(-1)
                               for k in self.names])

    def train_one_batch(self, ctx, x, y):
        """One data-parallel back-propagation step on the global batch ``(x, y)``."""
        from fastlib import losses

        n = x.shape[0]
        m = batch_blocks(n, self.options.blocks)
        bounds = block_bounds(n, m)
        a, b = rank_blocks(m, self.size, self.rank)
        dtype = np.dtype(ctx.model.dtype)
        # per block: loss * size, correct count, 1 when the loss has an accuracy
        metrics = np.zeros((m, 3))
        leaves = {}
        for j in range(a, b):
            lo, hi = bounds[j]
            pred = ctx.model.forward(x[lo:hi])
            loss, dpred = losses.loss_value_and_grad(ctx.loss_type, pred, y[lo:hi], check=False)
            correct = correct_count(ctx.loss_type, pred, y[lo:hi])
            metrics[j] = (float(loss) * (hi - lo), correct or 0.0, correct is not None)
            # the block's loss is a mean over its rows; the step's loss is over the global batch
            dpred = dpred * dtype.type((hi - lo) / n)
            _, grads = ctx.model.backward(dpred, need_input_grad=False)
            leaves[(j, j + 1)] = self._flat(grads, dtype)
        metrics = self.comm.allreduce_sum(metrics, f"step {ctx.step + 1} (the batch's losses)")
        loss_sum = 0.0
        for j in range(m):  # block order, on every rank
            loss_sum += metrics[j, 0]
        loss = loss_sum / n
        correct = float(metrics[:, 1].sum()) if metrics[:, 2].all() else None
        if not math.isfinite(loss):
            return BatchResult(loss, correct, False)
        flat = self.reduce(leaves, m, dtype, ctx.step + 1)
        grads, off = {}, 0
        for k in self.names:
            p = ctx.params[k]
            grads[k] = flat[off:off + p.size].reshape(p.shape)
            off += p.size
        info = clip_gradients(grads, ctx.config.gradient_clip, ctx.config.clip_mode)
        if not info.finite:
            return BatchResult(loss, correct, True, grads)
        ctx.opt_state = ctx.optimizer.update(ctx.params, grads, ctx.opt_state, lr=ctx.lr)
        return BatchResult(loss, correct, False, grads)

    def reduce(self, leaves, m, dtype, step):
        """The batch gradient: the tree sum of every rank's block gradients, on every rank."""
        k = self.size
        size = sum(int(p.size) for p in self.ctx.params.values())
        nodes = [tree_nodes(0, m, *rank_blocks(m, k, r)) for r in range(k)]
        mine = {node: tree_sum(leaves, *node) for node in nodes[self.rank]}
        cuts = [(c * size) // k for c in range(k + 1)]
        lens = [cuts[c + 1] - cuts[c] for c in range(k)]
        send = np.concatenate([np.zeros(0, dtype)] + [
            mine[node][cuts[c]:cuts[c + 1]] for c in range(k) for node in nodes[self.rank]])
        sendcounts = [len(nodes[self.rank]) * lens[c] for c in range(k)]
        recvcounts = [len(nodes[r]) * lens[self.rank] for r in range(k)]
        recv = np.empty(sum(recvcounts), dtype)
        self.comm.alltoallv(send, sendcounts, recv, recvcounts, f"step {step} (gradients)")
        values, off, width = {}, 0, lens[self.rank]
        for r in range(k):
            for node in nodes[r]:
                values[node] = recv[off:off + width]
                off += width
        chunk = np.ascontiguousarray(tree_sum(values, 0, m), dtype=dtype) if m else \
            np.zeros(width, dtype)
        out = np.empty(size, dtype)
        self.comm.allgatherv(chunk, out, lens, f"step {step} (gathering the gradient)")
        return out

    def evaluate(self, model, x, y, loss_type, chunk=EVAL_CHUNK):
        """``evaluate_model`` with its chunks shared among the ranks; the same result, bit for
        bit (each chunk's value is non-zero on one rank only, and the sum runs in chunk order)."""
        from fastlib import losses

        n = x.shape[0]
        starts = list(range(0, n, chunk))
        parts = np.zeros((len(starts), 3))
        for i, start in enumerate(starts):
            if i % self.size != self.rank:
                continue
            xb, yb = x[start:start + chunk], y[start:start + chunk]
            pred = model.forward(xb)
            parts[i, 0] = losses.loss_value(loss_type, pred, yb, check=False) * xb.shape[0]
            acc = losses.accuracy(loss_type, pred, yb, check=False)
            parts[i, 1:] = (0.0, 0.0) if acc is None else (float(acc) * xb.shape[0], 1.0)
        parts = self.comm.allreduce_sum(parts, "the validation pass")
        total, correct = 0.0, 0.0
        for i in range(len(starts)):
            total += parts[i, 0]
            correct = None if correct is None or not parts[i, 2] else correct + parts[i, 1]
        return total / n, (None if correct is None else correct / n)

    # -- epochs and failures ---------------------------------------------------------------------
    def agree_stop(self, stop):
        """Rank 0's decision to stop (callbacks run on every rank; rank 0's word counts)."""
        return self.comm.bcast_obj(stop, "the end-of-epoch agreement")

    def guard(self, run):
        """Run ``run()``; an exception on this rank aborts the job with a message naming it."""
        try:
            if self.rank == 0:
                result = run()
            else:
                with warnings.catch_warnings():  # only rank 0 speaks
                    warnings.simplefilter("ignore")
                    result = run()
        except BaseException as exc:  # noqa: BLE001 - any failure must stop every rank
            import traceback

            # the one line that names the rank first, then the traceback behind it
            _report(f"rank {self.rank} of {self.size} raised {type(exc).__name__}: {exc}; "
                    "aborting every rank")
            traceback.print_exc(file=sys.stderr)
            self.comm.abort(4)
            raise
        self.finish()
        return result


def attach(ctx, algo, x, distributed, verbose):
    """Make a training run data-parallel over MPI; return its session.

    Parameters
    ----------
    ctx : fastlib.training.algorithms.StepContext
        The run's context (its state is replaced by rank 0's).
    algo : fastlib.training.algorithms.Algorithm
        The run's algorithm; ``session.algo`` is it with a data-parallel step and a sharded
        evaluation, the one the run must use from now on.
    x : ndarray
        The training inputs (to say at start-up which path the run takes).
    distributed : True or DataParallel
    verbose : bool
        Rank 0 prints its start-up line. Only rank 0 (``session.rank == 0``) should show
        progress and write checkpoints.

    Raises
    ------
    NotImplementedError
        For an algorithm that does not run data-parallel (:data:`UNSUPPORTED`, or any
        algorithm other than ``"bp"``), with the reason.
    ImportError
        Without mpi4py, with the command that installs it.
    ValueError
        When the number of ranks does not divide the blocks per batch (:func:`check_ranks`).
    """
    options = resolve(distributed)
    name = algo.name
    if name in UNSUPPORTED:
        raise NotImplementedError(f"algorithm {name!r} does not run data-parallel: "
                                  f"{UNSUPPORTED[name]}; train it with distributed=False")
    if name != "bp":
        raise NotImplementedError(f"algorithm {name!r} does not run data-parallel: only 'bp' "
                                  "has a data-parallel step; train it with distributed=False")
    if ctx.config.device != "cpu":
        raise NotImplementedError("distributed training runs on the CPU kernels; use "
                                  "device='cpu'")
    check_ranks(options.blocks, world()[1])  # before any collective: every rank raises it
    session = _Session(ctx, options)
    from fastlib.training.schedules import schedule_for

    chosen = schedule_for(ctx, x)
    fused_possible = chosen is not None and chosen[0].name == "mlp"
    session.algo = session.wrap(algo)
    session.broadcast_state()
    if session.rank == 0 and verbose:
        session.banner(fused_possible)
    return session
