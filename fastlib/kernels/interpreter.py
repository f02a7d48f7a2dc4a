"""The compiled program's one epoch: its rows (:mod:`fastlib.kernels.instructions`) interpreted
over each batch cut into pieces of samples, then the epoch skeleton.

Per batch, one parallel region runs every piece on one thread: its samples gathered time-major
(row ``t * n + s``), the rows forward, the loss terms of its output rows, the rows backward
into its partial gradient; then the pieces' terms are added in piece order and the skeleton
(:mod:`fastlib.kernels.skeleton`) sums the partials, guards, clips and updates. Each row runs
its kind's one forward and one backward kernel, the kernels the layers call. In mixed
precision (``skeleton.Precision``) the rows read the 16-bit weights and the inputs, each
unit's output and input cotangent, the scaled loss cotangent and the summed gradient are
rounded as the per-batch path rounds them. The arguments are named tuples (:data:`EpochPlan`
and the others below). The story: docs/architecture.md, "Training".
"""
from __future__ import annotations

import collections
import math

import numpy as np

from numba import njit, prange

from fastlib.kernels import attention as ka
from fastlib.kernels import dense as kd
from fastlib.kernels import half
from fastlib.kernels import instructions as ins
from fastlib.kernels import optim as kopt
from fastlib.kernels import recurrent as kr
from fastlib.kernels import skeleton as sk
from fastlib.kernels.batch_loss import batch_mean, loss_terms
from fastlib.kernels.instructions import block_matrix, block_vector, slot_column, slot_view
from fastlib.kernels.native_call import call_compiled

#: The program and how a batch is cut: ``tables`` (``instructions.ProgramTables``), the model
#: input's and output's slots, positions per sample, the batch size, samples per ``piece``,
#: ``threads``, the loss code (``optable.losses.LOSS_CODES``), the update blocks' ``cuts``
#: (``skeleton.block_cuts``), whether the input is token ids, and per row the slots a mixed run
#: rounds (``rounds``, int64 ``(rows, 2)``: the values of column 0's slot after the row's
#: forward, the cotangent of column 1's slot after its backward; -1: none).
EpochPlan = collections.namedtuple(
    "EpochPlan", "tables input_slot output_slot steps batch_size piece threads loss_code cuts "
                 "tokens rounds")
#: The epoch's data: ``features`` (N, steps * width) or ``tokens`` (N, steps) (the other one
#: empty), the targets as class indices ``classes`` or rows ``values`` (one per output row of
#: a sample, sample-major), and the sample ``order``.
EpochData = collections.namedtuple("EpochData", "features tokens classes values order")
#: The flat parameters ``w``, the optimizer's state ``a``, ``b`` and the summed gradient ``g``.
EpochState = collections.namedtuple("EpochState", "w a b g")
#: Per piece (first axis): the partial gradient ``part``, activations ``act`` and their
#: cotangents ``gact`` (the slots' layout), token ids ``tok``, scratch ``acc`` (float64),
#: ``tmp`` and ``sc``, the output rows' ``target_rows``, the loss ``totals`` and ``corrects``;
#: and the update blocks' sums of squares ``sumsq``.
EpochBuffers = collections.namedtuple(
    "EpochBuffers", "part act gact tok acc tmp sc target_rows totals corrects sumsq")
#: The optimizer ``kind`` (``fastlib.kernels.optim``), its per-step ``coeffs`` rows, the
#: clipping mode (``skeleton.CLIP_*``) and value.
EpochUpdate = collections.namedtuple("EpochUpdate", "kind coeffs clip_mode clip")


# ---------------------------------------------------------------------------------------------
# one row, forward and backward

# NOTE: compile time. Numba links each callee's optimised module into its caller and optimises
# and emits the whole again, so every level of calls between a leaf kernel and the epoch costs
# one more pass over all the code below it. The rows call each kind's kernel, and ``epoch``
# calls ``_piece``, by address (``fastlib.kernels.native_call``): no level rebuilds a kernel's
# code. Before, the parallel loop's body, its two wrappers and the epoch each rebuilt all of
# ``_piece`` (a cold float64 LSTM run: 73 s of processor time, then 50 s), and ``_piece``
# rebuilt every kind's kernels, the program's or not (then 37 s). A row calls the very machine
# code a layer calls. The rows are ordinary calls, not inlined at Numba's IR level, which
# copied and typed their bodies again (a second more per dtype).

#: The row kernels ``_piece`` calls by address, in the order of their index in the ``kernels``
#: table (:func:`row_kernels`; the names below): the instruction kind, the kernel, and what its
#: call site below passes, by letter: a piece's activation-dtype matrix (``M``, a slot or block
#: view) or vector (``V``), its token ids ``T``, ``acc``, ``tmp`` and ``sc`` rows (``A``,
#: ``W``, ``S``), an int64 ``i``, an activation-dtype scalar ``f``, a float64 ``d`` (a row's
#: ``eps``) and a bool ``b``.
ROW_KERNELS = (
    (ins.EMBEDDING, kd.embedding_forward, "TMM"),
    (ins.DENSE, kd.dense_forward, "MMVMMif"),
    (ins.LAYER_NORM, kd.layer_norm_forward, "MVVdMVM"),
    (ins.RMS_NORM, kd.rms_norm_forward, "MVdVM"),
    (ins.SWIGLU, kd.swiglu_forward, "MMMMMM"),
    (ins.ATTENTION, ka.attention_forward, "MMVMVMMMVMiiifbiS"),
    (ins.RNN, kr.recurrent_forward, "MMMVMMMMMMiibbiS"),
    (ins.EMBEDDING, kd.embedding_backward, "TMMAiii"),
    (ins.DENSE, kd.dense_backward, "MMMMMMMVAMiWif"),
    (ins.LAYER_NORM, kd.layer_norm_backward, "MMVVMiVVA"),
    (ins.RMS_NORM, kd.rms_norm_backward, "MMVVMiVA"),
    (ins.SWIGLU, kd.swiglu_backward, "MMMMMMMMMMMiW"),
    (ins.ATTENTION, ka.attention_backward, "MMMMMMMMMMVMVAMiWiiifbiS"),
    (ins.RNN, kr.recurrent_backward, "MMMMMMMMMMMMMVAMiWiibbiS"),
)
(EMBEDDING_FORWARD, DENSE_FORWARD, LAYER_NORM_FORWARD, RMS_NORM_FORWARD, SWIGLU_FORWARD,
 ATTENTION_FORWARD, RECURRENT_FORWARD, EMBEDDING_BACKWARD, DENSE_BACKWARD, LAYER_NORM_BACKWARD,
 RMS_NORM_BACKWARD, SWIGLU_BACKWARD, ATTENTION_BACKWARD, RECURRENT_BACKWARD) = range(
    len(ROW_KERNELS))


@njit(inline="always")
def _entry(kernels, k):
    return kernels[k, 0], kernels[k, 1]


@njit(cache=True, error_model="numpy")
def _forward_row(r, slots, blocks, n, w, act, tok, sc, kernels):
    """Row ``r`` forward over the piece's ``n`` samples."""
    op = r.op
    steps = slots[r.x].steps
    y = slot_view(act, slots[r.y], n)
    if op == ins.EMBEDDING:
        call_compiled(_entry(kernels, EMBEDDING_FORWARD),
                      (tok[:n * steps], block_matrix(w, blocks[r.weight]), y))
        return
    x = slot_view(act, slots[r.x], n)
    if op == ins.DENSE:
        call_compiled(_entry(kernels, DENSE_FORWARD), (
            x, block_matrix(w, blocks[r.weight]), block_vector(w, blocks[r.bias]),
            slot_view(act, slots[r.pre], n), y, r.activation, act.dtype.type(r.slope)))
    elif op == ins.LAYER_NORM:
        call_compiled(_entry(kernels, LAYER_NORM_FORWARD), (
            x, block_vector(w, blocks[r.weight]), block_vector(w, blocks[r.bias]), r.eps,
            slot_view(act, slots[r.xhat], n), slot_column(act, slots[r.rstd], n), y))
    elif op == ins.RMS_NORM:
        call_compiled(_entry(kernels, RMS_NORM_FORWARD), (
            x, block_vector(w, blocks[r.weight]), r.eps, slot_column(act, slots[r.rrms], n), y))
    elif op == ins.SWIGLU:
        call_compiled(_entry(kernels, SWIGLU_FORWARD), (
            x, block_matrix(w, blocks[r.w_gate_up]), block_matrix(w, blocks[r.w_down]),
            slot_view(act, slots[r.gate_up], n), slot_view(act, slots[r.gated], n), y))
    elif op == ins.ATTENTION:
        call_compiled(_entry(kernels, ATTENTION_FORWARD), (
            x, block_matrix(w, blocks[r.w_qkv]), block_vector(w, blocks[r.b_qkv]),
            block_matrix(w, blocks[r.w_o]), block_vector(w, blocks[r.b_o]),
            slot_view(act, slots[r.qkv], n), slot_view(act, slots[r.att], n),
            slot_view(act, slots[r.probs], n), act[:0], y, n, steps, r.heads,
            act.dtype.type(r.scale), r.causal != 0, n, sc))
    elif op == ins.RNN or op == ins.LSTM:
        gates = slot_view(act, slots[r.gates], n)
        lstm = op == ins.LSTM
        # an RNN has no cells: its gates stand in for the LSTM's cell buffers (never read)
        cs = slot_view(act, slots[r.cells], n) if lstm else gates
        tcs = slot_view(act, slots[r.cell_tanh], n) if lstm else gates
        call_compiled(_entry(kernels, RECURRENT_FORWARD), (
            x, block_matrix(w, blocks[r.w_ih]), block_matrix(w, blocks[r.w_hh]),
            block_vector(w, blocks[r.bias]), gates, slot_view(act, slots[r.states], n), cs, tcs,
            y, gates, n, steps, lstm, r.every_state != 0, n, sc))
    elif op == ins.ADD:
        x2 = slot_view(act, slots[r.x2], n)
        for i in range(y.shape[0]):
            a, b, o = x[i], x2[i], y[i]
            for j in range(y.shape[1]):
                o[j] = a[j] + b[j]
    elif op == ins.COLUMNS:  # y[:, col0:col0 + width] = x
        for i in range(y.shape[0]):
            a, o = x[i], y[i]
            for j in range(x.shape[1]):
                o[r.col0 + j] = a[j]
    else:
        # never reached by a program that passed instructions.check_program
        raise ValueError("compiled program: unknown op code in a forward row")


@njit(cache=True, error_model="numpy")
def _backward_row(r, slots, blocks, n, w, act, gact, tok, part, acc, tmp, sc, kernels):
    """Row ``r`` backward: its parameters' gradients into ``part`` (every entry written), its
    inputs' cotangents into ``gact`` by their modes."""
    op = r.op
    steps = slots[r.x].steps
    g = slot_view(gact, slots[r.y], n)
    if op == ins.EMBEDDING:
        call_compiled(_entry(kernels, EMBEDDING_BACKWARD), (
            tok[:n * steps], g, block_matrix(part, blocks[r.weight]), acc, n, steps, n))
        return
    x = slot_view(act, slots[r.x], n)
    gx = slot_view(gact, slots[r.x], n)
    mode = r.grad_x
    if op == ins.DENSE:
        call_compiled(_entry(kernels, DENSE_BACKWARD), (
            x, block_matrix(w, blocks[r.weight]), slot_view(act, slots[r.pre], n),
            slot_view(act, slots[r.y], n), g, g, block_matrix(part, blocks[r.weight]),
            block_vector(part, blocks[r.bias]), acc, gx, mode, tmp, r.activation,
            act.dtype.type(r.slope)))
    elif op == ins.LAYER_NORM:
        call_compiled(_entry(kernels, LAYER_NORM_BACKWARD), (
            g, slot_view(act, slots[r.xhat], n), slot_column(act, slots[r.rstd], n),
            block_vector(w, blocks[r.weight]), gx, mode, block_vector(part, blocks[r.weight]),
            block_vector(part, blocks[r.bias]), acc))
    elif op == ins.RMS_NORM:
        call_compiled(_entry(kernels, RMS_NORM_BACKWARD), (
            g, x, slot_column(act, slots[r.rrms], n), block_vector(w, blocks[r.weight]), gx,
            mode, block_vector(part, blocks[r.weight]), acc))
    elif op == ins.SWIGLU:
        call_compiled(_entry(kernels, SWIGLU_BACKWARD), (
            x, block_matrix(w, blocks[r.w_gate_up]), block_matrix(w, blocks[r.w_down]),
            slot_view(act, slots[r.gate_up], n), slot_view(act, slots[r.gated], n), g,
            slot_view(gact, slots[r.gated], n), slot_view(gact, slots[r.gate_up], n),
            block_matrix(part, blocks[r.w_gate_up]), block_matrix(part, blocks[r.w_down]), gx,
            mode, tmp))
    elif op == ins.ATTENTION:
        call_compiled(_entry(kernels, ATTENTION_BACKWARD), (
            x, block_matrix(w, blocks[r.w_qkv]), block_matrix(w, blocks[r.w_o]),
            slot_view(act, slots[r.qkv], n), slot_view(act, slots[r.att], n),
            slot_view(act, slots[r.probs], n), g, slot_view(gact, slots[r.att], n),
            slot_view(gact, slots[r.qkv], n), block_matrix(part, blocks[r.w_qkv]),
            block_vector(part, blocks[r.b_qkv]), block_matrix(part, blocks[r.w_o]),
            block_vector(part, blocks[r.b_o]), acc, gx, mode, tmp, n, steps, r.heads,
            act.dtype.type(r.scale), r.causal != 0, n, sc))
    elif op == ins.RNN or op == ins.LSTM:
        gates = slot_view(act, slots[r.gates], n)
        lstm = op == ins.LSTM
        cs = slot_view(act, slots[r.cells], n) if lstm else gates
        tcs = slot_view(act, slots[r.cell_tanh], n) if lstm else gates
        # the gates' cotangents in the cotangent buffer's gates slot (the rows are already the
        # cells' layout, so no copy is needed)
        dz = slot_view(gact, slots[r.gates], n)
        call_compiled(_entry(kernels, RECURRENT_BACKWARD), (
            x, block_matrix(w, blocks[r.w_ih]), block_matrix(w, blocks[r.w_hh]), gates,
            slot_view(act, slots[r.states], n), cs, tcs, g, g, dz, dz,
            block_matrix(part, blocks[r.w_ih]), block_matrix(part, blocks[r.w_hh]),
            block_vector(part, blocks[r.bias]), acc, gx, mode, tmp, n, steps, lstm,
            r.every_state != 0, n, sc))
    elif op == ins.ADD:
        kd.pass_grad(g, gx, mode)
        kd.pass_grad(g, slot_view(gact, slots[r.x2], n), r.grad_x2)
    elif op == ins.COLUMNS:
        if mode != ins.GRAD_SKIP:
            for i in range(gx.shape[0]):
                a, o = g[i], gx[i]
                for j in range(gx.shape[1]):
                    if mode == ins.GRAD_ADD:
                        o[j] += a[r.col0 + j]
                    else:
                        o[j] = a[r.col0 + j]
    else:
        raise ValueError("compiled program: unknown op code in a backward row")


# ---------------------------------------------------------------------------------------------
# one piece: gather, forward, loss, backward

@njit(cache=True, error_model="numpy")
def _gather(plan, data, first, n, act, tok, code):
    """The piece's samples ``order[first:first + n]``, time-major: token ids into ``tok``, or
    features into the input slot (rounded to the 16-bit format ``code`` unless it is -1)."""
    steps = plan.steps
    if plan.tokens:
        for s in range(n):
            src = data.tokens[data.order[first + s]]
            for t in range(steps):
                tok[t * n + s] = src[t]
        return
    xin = slot_view(act, plan.tables.slots[plan.input_slot], n)
    width = xin.shape[1]
    for s in range(n):
        src = data.features[data.order[first + s]]
        for t in range(steps):
            dst = xin[t * n + s]
            for j in range(width):
                dst[j] = src[t * width + j]
    _round_slot(code, act, plan.tables.slots[plan.input_slot], n)


@njit(cache=True, error_model="numpy")
def _round_slot(code, buf, slot, n):
    """The ``n`` samples' entries of ``slot`` in the piece's buffer ``buf`` rounded to the
    16-bit format ``code`` in place (-1: left as they are)."""
    if code >= 0:
        half.round_in_place(code, buf[slot.offset:slot.offset + n * slot.steps * slot.width])


@njit(cache=True, error_model="numpy")
def _piece(p, start, nb, n_mean, plan, data, state, bufs, prec, kernels):
    """Forward, loss terms and backward of piece ``p`` of the batch at ``start``, reading the
    weights ``prec.w16`` (the masters themselves in the model's dtype) and rounding as the
    run's precision ``prec`` says (the module's doc)."""
    first = start + p * plan.piece
    n = min(plan.piece, nb - p * plan.piece)
    rows, slots, blocks = plan.tables
    act, gact, tok = bufs.act[p], bufs.gact[p], bufs.tok[p]
    code, w = prec.code, prec.w16
    _gather(plan, data, first, n, act, tok, code)
    for k in range(rows.shape[0]):
        _forward_row(rows[k], slots, blocks, n, w, act, tok, bufs.sc[p], kernels)
        if plan.rounds[k, 0] >= 0:
            _round_slot(code, act, slots[plan.rounds[k, 0]], n)
    out = slots[plan.output_slot]
    # the output's rows (t * n + s) and their targets' rows (sample-major: sample * steps + t)
    target = bufs.target_rows[p, :n * out.steps]
    for s in range(n):
        for t in range(out.steps):
            target[t * n + s] = data.order[first + s] * out.steps + t
    bufs.totals[p], bufs.corrects[p] = loss_terms(
        plan.loss_code, slot_view(act, out, n), data.classes, data.values, target,
        slot_view(gact, out, n), n_mean)
    if not math.isfinite(bufs.totals[p]):
        return                          # the epoch stops at this batch; no gradient needed
    sk.loss_cotangent_in_format(prec, gact[out.offset:out.offset + n * out.steps * out.width])
    for k in range(rows.shape[0] - 1, -1, -1):
        _backward_row(rows[k], slots, blocks, n, w, act, gact, tok, bufs.part[p],
                      bufs.acc[p], bufs.tmp[p], bufs.sc[p], kernels)
        if plan.rounds[k, 1] >= 0:
            _round_slot(code, gact, slots[plan.rounds[k, 1]], n)


# ---------------------------------------------------------------------------------------------
# the epoch

@njit(cache=True, parallel=True, error_model="numpy")
def epoch(plan, data, state, bufs, update, prec, piece_entry, kernels):
    """Train one epoch; returns (loss_sum, correct, skipped, updates, diverged_batch, loss).

    Per step: the pieces' region, the loss (the pieces' terms added in piece order), and the
    skeleton's end of the step, in the run's precision ``prec`` (``skeleton.Precision``).
    Each piece runs :func:`_piece` through ``piece_entry`` (:func:`piece_entry`): not linked
    in (``fastlib.kernels.native_call``). ``correct`` counts output rows (one per position of
    a sequence output). NaN/Inf rules as the generic path: a non-finite loss returns at once
    (the caller restores the weights); a non-finite gradient skips the update (``skipped``).
    """
    # NOTE: flush-to-zero (see fastlib.kernels.optim) for the serial parts, and inside every
    # region for each thread; regions are launched with the caller's control word restored (a
    # worker thread inherits the launching thread's, and keeps it for later kernels)
    old_fp = kopt.enter_ftz()
    # NOTE: a parallel loop takes arrays and scalars only (no tuples of arrays): the named
    # tuples are taken apart here and put together again in each thread
    rows, slots, blocks = plan.tables
    input_slot, output_slot, steps, batch_size = (plan.input_slot, plan.output_slot,
                                                  plan.steps, plan.batch_size)
    piece, plan_threads, loss_code, cuts, tokens, rounds = (
        plan.piece, plan.threads, plan.loss_code, plan.cuts, plan.tokens, plan.rounds)
    features, tok_in, classes, values, order = data
    w, a, b, g = state
    part, act, gact, tok, acc, tmp, sc, target_rows, totals, corrects, sumsq = bufs
    fmt, w16, scale, clean, skips, scaled, growth, backoff, interval, dynamic = prec
    n_samples = data.order.shape[0]
    out = plan.tables.slots[plan.output_slot]
    loss_sum = 0.0
    correct_sum = 0.0
    skipped = 0
    updates = 0
    batch = 0
    for start in range(0, n_samples, plan.batch_size):
        nb = min(plan.batch_size, n_samples - start)
        n_pieces = -(-nb // plan.piece)
        n_mean = nb * out.steps
        threads = min(plan.threads, n_pieces)
        # the gradient's unscale factor: the reciprocal in float64, rounded once to the dtype
        # (as torch.amp.GradScaler.unscale_ takes it)
        unscale = state.g.dtype.type(1.0 / prec.scale[0])
        if threads == 1:                # no region: no thread hand-off for a one-piece batch
            for p in range(n_pieces):
                call_compiled(piece_entry, (p, start, nb, n_mean, plan, data, state, bufs, prec,
                                            kernels))
        else:
            kopt.leave_ftz(old_fp)
            for t in prange(threads):
                old = kopt.enter_ftz()  # per worker thread: the control word is thread-local
                mine = EpochPlan(ins.ProgramTables(rows, slots, blocks), input_slot,
                                 output_slot, steps, batch_size, piece, plan_threads, loss_code,
                                 cuts, tokens, rounds)
                for p in range(t, n_pieces, threads):
                    call_compiled(piece_entry, (
                        p, start, nb, n_mean, mine,
                        EpochData(features, tok_in, classes, values, order),
                        EpochState(w, a, b, g),
                        EpochBuffers(part, act, gact, tok, acc, tmp, sc, target_rows, totals,
                                     corrects, sumsq),
                        sk.Precision(fmt, w16, scale, clean, skips, scaled, growth, backoff,
                                     interval, dynamic), kernels))
                kopt.leave_ftz(old)
            kopt.enter_ftz()
        total = 0.0
        correct = 0.0
        for p in range(n_pieces):
            total += bufs.totals[p]
            correct += bufs.corrects[p]
        loss = batch_mean(plan.loss_code, total, n_mean, out.width)
        if not math.isfinite(loss):
            kopt.leave_ftz(old_fp)
            return loss_sum, correct_sum, skipped, updates, batch, loss
        loss_sum += loss * nb
        correct_sum += correct
        kopt.leave_ftz(old_fp)
        applied = sk.end_step(plan.threads, plan.cuts, n_pieces, bufs.part, state.g, bufs.sumsq,
                              update.kind, state.w, state.a, state.b,
                              update.coeffs[updates:updates + 1], update.clip_mode, update.clip,
                              prec, unscale)
        kopt.enter_ftz()
        batch += 1
        if not applied:
            skipped += 1
            continue
        updates += 1
    kopt.leave_ftz(old_fp)
    return loss_sum, correct_sum, skipped, updates, -1, 0.0


def row_kernels(plan, bufs):
    """The native entries of the row kernels ``plan``'s program runs (``epoch``'s last
    argument): an int64 ``(len(ROW_KERNELS), 2)`` table of (address, key), zero for a kind the
    program lacks (its kernel is not compiled; a call would raise, never run)."""
    from fastlib.compile_once import native_entry

    kinds = set(int(op) for op in plan.tables.rows["op"])
    if ins.LSTM in kinds:
        kinds.add(ins.RNN)             # one recurrent kernel serves both
    act = bufs.act[0]
    dtype = act.dtype
    samples = {"M": np.zeros((2, 2), dtype), "V": np.zeros(2, dtype), "T": bufs.tok[0],
               "A": bufs.acc[0], "W": bufs.tmp[0], "S": bufs.sc[0], "i": np.int64(0),
               "f": dtype.type(0), "d": np.float64(0), "b": True}
    table = np.zeros((len(ROW_KERNELS), 2), np.int64)
    for k, (kind, kernel, arguments) in enumerate(ROW_KERNELS):
        if kind in kinds:
            table[k] = native_entry(kernel, *(samples[a] for a in arguments))
    return table


def piece_entry(plan, data, state, bufs, prec, kernels):
    """The native entry of :func:`_piece` for these arguments' types (``epoch``'s
    ``piece_entry``): compiled once, on its own, and called by address from the epoch."""
    from fastlib.compile_once import native_entry

    zero = np.int64(0)
    return native_entry(_piece, zero, zero, zero, zero, plan, data, state, bufs, prec,
                        kernels)
