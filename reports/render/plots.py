"""PNG figures of a gradient-accuracy report (matplotlib, Agg backend), drawn from the report
dict alone so that any saved report.json can be drawn again.

- :func:`op_figure`: one op: the distribution of ULP errors per engine and dtype (with the
  floor), the median ULP error against input magnitude, and the finite-difference error
  against step size with each engine's median as a line;
- :func:`overview_figure`: the median ULP error of every op × engine × dtype as a heat map, and
  the finite-difference error against step over all ops (where differences fail).

Each returns PNG bytes; nothing is written or shown.
"""
from __future__ import annotations

import io
import math

import numpy as np

import optable

from reports.accuracy import as_float
from reports.render import columns as engine_columns

# Display limits on log axes: an exact result is drawn at ZERO_AT (ULP axes) or REL_ZERO_AT
# (relative-error axes), an infinite error at INF_AT, with the axes labelled accordingly.
ZERO_AT = 1e-3
REL_ZERO_AT = 1e-20
INF_AT = 1e18
DPI = 80


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig):
    # NOTE: no tight_layout / bbox_inches="tight": each costs a full extra draw (measuring
    # every tick label), which made a figure take seconds; fixed margins are set instead.
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _lean_log(ax, axis="both"):
    """Log axes with a few labelled decades and no minor labels (cheap to draw, readable)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    # NOTE: plain "1e-6" labels; the default 10^{-6} goes through mathtext, the slowest part
    # of drawing these figures.
    plain = FuncFormatter(lambda v, _pos: f"1e{math.log10(v):.0f}" if v > 0 else "0")
    for name in ("x", "y") if axis == "both" else (axis,):
        which = ax.xaxis if name == "x" else ax.yaxis
        which.set_major_locator(LogLocator(base=10, numticks=7))
        which.set_major_formatter(plain)
        which.set_minor_locator(NullLocator())
        which.set_minor_formatter(NullFormatter())


def engine_names(report):
    """The engine names of a report's rows, in first-seen order."""
    names = []
    for res in report["ops"].values():
        for r in res["rows"]:
            if r["kind"] == "engine" and r["engine"] not in names:
                names.append(r["engine"])
    return names


def engine_colors(names):
    """One colour per engine name (tab10 order), stable across every figure of a report."""
    plt = _pyplot()
    cmap = plt.get_cmap("tab10")
    return {n: tuple(cmap(i % 10)) for i, n in enumerate(names)}


def _display(v, zero_at=ZERO_AT):
    """A value for a log axis: 0 -> ``zero_at``, inf -> INF_AT, undefined -> NaN."""
    v = as_float(v)
    if math.isnan(v):
        return math.nan
    if math.isinf(v):
        return INF_AT
    return max(v, zero_at)


def _rel(v):
    return _display(v, REL_ZERO_AT)


LINESTYLE = {"float32": "-", "float64": "--", "bfloat16": ":", "float16": "-."}
MARKER = {"float32": "o", "float64": "s", "bfloat16": "^", "float16": "v"}
SHORT = {"float32": "32", "float64": "64", "bfloat16": "bf16", "float16": "f16"}
DTYPE_COLOR = {"float32": "C0", "float64": "C3", "bfloat16": "C2", "float16": "C1"}


def _label(r):
    return f"{r['engine']} {SHORT[r['dtype']]}"


def _histogram_panel(ax, rows, edges, colors):
    # Bins: [exact 0], the finite edges (log10 positions), [infinite].
    finite_edges = np.array([as_float(e) for e in edges[1:-1]])
    logs = np.log10(finite_edges)
    width = logs[1] - logs[0]
    x_zero, x_inf = logs[0] - 4 * width, logs[-1] + 3 * width
    centres = np.concatenate([[logs[0] - width / 2], logs + width / 2])
    floor_drawn = False
    for r in rows:
        h = r.get("histogram")
        if not h or not r.get("n") or (r["kind"] == "floor" and floor_drawn):
            continue
        total = r["n"]
        # counts[0] is (0, edges[1]); counts[i] is [edges[i], edges[i + 1]) after it
        counts = np.array(h["counts"], dtype=float) / total
        if r["kind"] == "floor":
            style = dict(color="black", lw=0.9, ls=":")
            label = "floor (exact, rounded)"
            floor_drawn = True
        else:
            style = dict(color=colors.get(r["engine"], "black"), lw=1.5,
                         ls=LINESTYLE[r["dtype"]])
            label = _label(r)
        ax.step(centres, counts, where="mid", label=label, **style)
        ax.plot([x_zero], [h["zero"] / total], marker=MARKER[r["dtype"]], ms=4, ls="none",
                color=style["color"])
        if h["infinite"]:
            ax.plot([x_inf], [h["infinite"] / total], marker="x", ms=6, ls="none",
                    color=style["color"])
    decades = list(range(0, int(logs[-1]) + 1, 4))
    ax.set_xticks([x_zero] + decades + [x_inf])
    ax.set_xticklabels(["0"] + [f"1e{t}" for t in decades] + ["inf"], fontsize=7)
    ax.set_xlabel("error (ULPs); marks at left: exact, x at right: infinite", fontsize=7)
    ax.set_ylabel("share of elements", fontsize=7)


def _bin_centre(b):
    lo, hi = as_float(b["lo"]), as_float(b["hi"])
    if hi == 0:
        return 1e-7                               # the "exactly zero" bin, drawn leftmost
    if lo == 0:
        return hi / 3
    return math.sqrt(lo * hi) if math.isfinite(hi) else lo * 3


def _magnitude_panel(ax, rows, colors):
    for r in rows:
        if r["kind"] != "engine" or not r.get("n"):
            continue
        pts = [(_bin_centre(b), _display(b["median_ulp"])) for b in r["by_magnitude"] if b["n"]]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker=MARKER[r["dtype"]], ms=3, lw=1.3, ls=LINESTYLE[r["dtype"]],
                    color=colors.get(r["engine"], "black"), label=_label(r))
    ax.set_xscale("log")
    ax.set_yscale("log")
    _lean_log(ax)
    ax.set_xlabel("|input entry| (leftmost point: exactly 0)", fontsize=7)
    ax.set_ylabel("median error (ULPs)", fontsize=7)


def _fd_panel(ax, rows, colors):
    for dtype in LINESTYLE:
        fd = [r for r in rows if r["kind"] == "finite_difference" and r["dtype"] == dtype
              and r.get("n")]
        if fd:
            ax.plot([r["step"] for r in fd], [_rel(r["rel"]["median"]) for r in fd],
                    marker=MARKER[dtype], color="black", lw=1.6, ls=LINESTYLE[dtype],
                    label=f"central FD {SHORT[dtype]}")
    for r in rows:
        if not r.get("n"):
            continue
        if r["kind"] == "engine":
            ax.axhline(_rel(r["rel"]["median"]), color=colors.get(r["engine"], "black"),
                       lw=1.0, ls=LINESTYLE[r["dtype"]], label=_label(r))
        elif r["kind"] == "floor":
            ax.axhline(_rel(r["rel"]["median"]), color="black", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _lean_log(ax)
    ax.set_xlabel("step h (× max(1, |z|)); dotted: floor", fontsize=7)
    ax.set_ylabel("median relative error", fontsize=7)


def op_figure(name, result, edges, colors):
    """The figure of op ``name`` as PNG bytes.

    Parameters
    ----------
    name : str
    result : dict
        ``report["ops"][name]``.
    edges : list
        ``report["histogram_edges"]``.
    colors : dict
        Engine name -> colour (:func:`engine_colors`).

    One row of three panels; engines by colour, float32 solid, float64 dashed, bfloat16
    dotted and float16 dash-dotted.
    """
    plt = _pyplot()
    rows = [r for r in result["rows"] if r["status"] != "unsupported"]
    fig, (a0, a1, a2) = plt.subplots(1, 3, figsize=(13, 3.5))
    _histogram_panel(a0, [r for r in rows if r["kind"] in ("engine", "floor")], edges, colors)
    a0.set_title(f"{name}: distribution of errors", fontsize=9)
    _magnitude_panel(a1, rows, colors)
    a1.set_title(f"{name}: error vs input magnitude", fontsize=9)
    _fd_panel(a2, rows, colors)
    a2.set_title(f"{name}: finite differences vs engines (medians)", fontsize=9)
    for ax in (a0, a1, a2):
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper right", framealpha=0.7)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.15, top=0.91, wspace=0.22)
    return _png(fig)


def overview_figure(report):
    """Median ULP error heat map (op × engine/dtype) and FD error vs step, as PNG bytes."""
    plt = _pyplot()
    ops = list(report["ops"])
    columns = engine_columns(report)
    grid = np.full((len(ops), len(columns)), np.nan)
    for i, name in enumerate(ops):
        for r in report["ops"][name]["rows"]:
            if r["kind"] == "engine" and r["status"] != "unsupported":
                grid[i, columns.index((r["engine"], r["dtype"]))] = \
                    math.log10(_display(r["ulp"]["median"]))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.22 * len(ops) + 1.5)),
                                   gridspec_kw={"width_ratios": [1.1, 1]})
    im = ax0.imshow(grid, aspect="auto", cmap="viridis", vmin=math.log10(ZERO_AT),
                    vmax=max(1.0, np.nanmax(grid) if np.isfinite(grid).any() else 1.0))
    ax0.set_yticks(range(len(ops)))
    ax0.set_yticklabels(ops, fontsize=7)
    ax0.set_xticks(range(len(columns)))
    ax0.set_xticklabels([f"{e}\n{d}" for e, d in columns], fontsize=7)
    ax0.set_title("median error, log10 ULPs (exact shown as -3)", fontsize=9)
    fig.colorbar(im, ax=ax0, fraction=0.04)
    for dtype in LINESTYLE:
        curves = []
        for res in report["ops"].values():
            pts = sorted((r["step"], _rel(r["rel"]["median"])) for r in res["rows"]
                         if r["kind"] == "finite_difference" and r["dtype"] == dtype
                         and r.get("n"))
            if pts:
                curves.append(pts)
                xs, ys = zip(*pts)
                ax1.plot(xs, ys, color=DTYPE_COLOR[dtype], lw=0.6, alpha=0.35,
                         ls=LINESTYLE[dtype])
        if curves:
            steps = sorted({h for c in curves for h, _ in c})
            med = [np.nanmedian([y for c in curves for h2, y in c if h2 == h]) for h in steps]
            ax1.plot(steps, med, marker=MARKER[dtype], lw=2, color=DTYPE_COLOR[dtype],
                     ls=LINESTYLE[dtype], label=f"{dtype}: each op (thin), median over ops "
                                               f"(thick)")
            eps = optable.formats.format_of(dtype).eps
            ax1.axhline(eps, ls=":", lw=0.8, color="gray")
            ax1.text(steps[0], eps, f" eps {dtype}", fontsize=7, va="bottom")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    _lean_log(ax1)
    ax1.set_xlabel("step h (× max(1, |z|))", fontsize=8)
    ax1.set_ylabel("median relative error of the VJP", fontsize=8)
    ax1.set_title("central finite differences: where they fail (linear ops sit at the "
                  "bottom: exact)", fontsize=9)
    ax1.grid(True, alpha=0.3)
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend(fontsize=7, loc="upper right")
    fig.subplots_adjust(left=0.16, right=0.98, bottom=0.1, top=0.95, wspace=0.3)
    return _png(fig)
