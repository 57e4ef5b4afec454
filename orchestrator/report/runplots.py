"""The report's plots of a run from its ranks' Flight Recorders and its record: the collective rate
over time with the alerts, stalls, failures and attempts on the same axis, and each rank's lateness
over time as a rank x time heat map with the straggler episodes marked."""

from __future__ import annotations

from typing import Any

from orchestrator.report.plots import new_figure, svg_data_uri
from orchestrator.report.runs import RunFigures

EVENT_STYLES = {  # kind -> (colour, line style, legend)
    "stall": ("#d62728", "-", "stall"),
    "failure": ("#000000", "-", "failure"),
    "straggler": ("#ff7f0e", "--", "straggler named"),
    "attempt": ("#7f7f7f", ":", "attempt start or end"),
}
OTHER_ALERT = ("#9467bd", "-.", "other alert")
RATE_COLOUR = "#1f77b4"
MARK_COLOUR = "#00bcd4"
LATE_SCALE_MS = 10.0  # the heat map's scale reaches at least this: ranks in lock-step stay pale


def mark_events(ax: Any, run: RunFigures) -> None:
    """A vertical line at each event's time, one legend entry per kind."""
    shown: set[str] = set()
    for event in run.events:
        colour, style, legend = EVENT_STYLES.get(event.kind, OTHER_ALERT)
        ax.axvline(event.t, color=colour, linestyle=style, linewidth=1.2,
                   label=None if legend in shown else legend)
        shown.add(legend)


def rate_plot(run: RunFigures, label: str) -> str | None:
    """Collectives completed per second over time, the events marked; None without two reads."""
    if not run.rate_series:
        return None
    fig, (ax,) = new_figure()
    fig.set_figwidth(14.0)
    ax.plot([p[0] for p in run.rate_series], [p[1] for p in run.rate_series], "o-", color=RATE_COLOUR,
            markersize=3, linewidth=1.6, label="collectives/s (every rank)")
    mark_events(ax, run)
    ax.set_xlim(0, max(run.wall_s, run.rate_series[-1][0]))
    ax.set_ylim(0, max(1.0, max(p[1] for p in run.rate_series) * 1.15))
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel("collectives/s")
    ax.set_title(f"{label}: collective rate; alerts, stalls and attempts")
    ax.legend(fontsize=8, loc="lower left")
    return svg_data_uri(fig)


def lateness_plot(run: RunFigures, label: str) -> str | None:
    """Each rank's mean lateness at entry over time, straggler alerts marked on their rank; None
    without collectives."""
    if not run.heat:
        return None
    fig, (ax,) = new_figure()
    fig.set_figwidth(14.0)
    fig.set_figheight(max(3.4, 1.2 + 0.22 * len(run.ranks)))
    ax.grid(False)
    first, last = run.heat_span
    top = max([LATE_SCALE_MS, *(v for row in run.heat for v in row if v == v)])
    image = ax.imshow(run.heat, aspect="auto", interpolation="nearest", cmap="magma_r", vmin=0.0, vmax=top,
                      extent=(first, last, len(run.ranks) - 0.5, -0.5))
    fig.colorbar(image, ax=ax, label="ms after the first rank (mean)")
    rows = {rank: i for i, rank in enumerate(run.ranks)}
    named = [(e.t, rows[e.rank]) for e in run.events if e.kind == "straggler" and e.rank in rows]
    if named:
        ax.plot([t for t, _ in named], [row for _, row in named], "v", color=MARK_COLOUR, markersize=9,
                markeredgecolor="black", linestyle="none", label="straggler named")
        ax.legend(fontsize=8, loc="upper left")
    step = max(1, len(run.ranks) // 16)
    ax.set_yticks(range(0, len(run.ranks), step),
                  [f"r{r} {run.nodes.get(r, '')}" for r in run.ranks[::step]], fontsize=8)
    ax.set_xlabel("seconds since the job started")
    ax.set_title(f"{label}: each rank's lateness entering its collectives")
    return svg_data_uri(fig)
