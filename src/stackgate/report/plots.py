"""The report's plots, drawn by matplotlib into inline SVG.

Why matplotlib: the report is one static HTML file that a CI artifact viewer opens offline, so a plot
must be finished markup, not a script that needs a JavaScript library (Vega, Plotly) loaded from the
network or embedded at a megabyte per report. matplotlib draws real axes (locators choose the ticks,
formatters write them), is maintained, runs headless (the Agg/SVG backends need no display), and with
`svg.fonttype = "none"` writes text as SVG <text>, which a browser lays out and a DOM test can read.
Text is never parsed as mathtext (`text.parse_math = False`): a metric name with `$` stays text.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

SERIES = ("#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a")
STYLE = {"svg.fonttype": "none", "text.parse_math": False, "font.size": 9, "axes.titlesize": 10,
         "svg.hashsalt": "stackgate", "font.family": "DejaVu Sans"}  # a fixed salt: the same report, the same SVG


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]  # (x, y); x is a date's ordinal seconds for a date axis
    marker: bool = False


# a trend's date ticks by their level (years, months, days, hours, minutes, seconds): a day always with its month
DATE_FORMATS = ["%Y", "%b", "%b %d", "%H:%M", "%H:%M", "%H:%M:%S"]
ZERO_DATE_FORMATS = ["%Y", "%b", "%b %d", "%b %d", "%H:%M", "%H:%M:%S"]  # midnight at the hour level: its day
OFFSET_DATE_FORMATS = ["", "%Y", "%Y", "%Y-%m-%d", "%Y-%m-%d", "%Y-%m-%d %H:%M"]


def distinct_digits(ticks: Sequence[float], least: int = 3) -> int:
    """Significant digits enough for every tick label to differ (265.8 and 266.2 are not both "266"), and
    for a value below a million to be written without an exponent (5480, not 5.48e+03)."""
    finite = [float(t) for t in ticks if math.isfinite(t)]
    top = max((abs(t) for t in finite), default=0.0)
    digits = max(least, math.floor(math.log10(top)) + 1 if 1 <= top < 1e6 else least)
    while digits < 12 and len({f"{t:.{digits}g}" for t in finite}) < len(finite):
        digits += 1
    return digits


def size_label(nbytes: float) -> str:
    """1 KiB, 4 MiB, 1 GiB: a message size as people say it."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{nbytes:.0f} B"


def line(title: str, series: Sequence[Series], *, xlabel: str, ylabel: str, x_sizes: bool = False,
         x_dates: bool = False, current: float | None = None) -> str:
    """A line plot as an inline <svg> (empty when no series has a finite point). `x_sizes`: message
    sizes on a log2 axis, labelled 1 KiB ...; `x_dates`: x are POSIX seconds, labelled as dates, with
    `current` (the run at hand) marked."""
    import matplotlib
    from matplotlib import dates as mdates
    from matplotlib import ticker
    from matplotlib.figure import Figure

    drawn = [(s, [(x, y) for x, y in s.points if math.isfinite(x) and math.isfinite(y)]) for s in series]
    if not any(points for _, points in drawn):
        return ""
    with matplotlib.rc_context(STYLE):  # type: ignore[arg-type]
        fig = Figure(figsize=(4.6, 2.8), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        marked = _day(current) if x_dates and current is not None else None
        days = [marked] if marked is not None else []
        for i, (s, points) in enumerate(drawn):
            if not points:
                continue
            xs = [_day(x) if x_dates else x for x, _ in points]
            if x_dates:
                days += xs
            ax.plot(xs, [y for _, y in points], color=SERIES[i % len(SERIES)], label=s.label,
                    marker="o" if s.marker or len(points) <= 12 else None, markersize=3, linewidth=1.5)
        if x_sizes:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(ticker.LogLocator(base=2, subs=(1.0,), numticks=6))  # readable, not crowded
            ax.xaxis.set_minor_locator(ticker.NullLocator())
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: size_label(v)))
        if x_dates:
            if max(days) - min(days) < 1:  # one date (a first run): matplotlib would widen it to +-2 years
                ax.set_xlim(min(days) - 0.5, max(days) + 0.5)
            locator = mdates.AutoDateLocator(minticks=3, maxticks=6)  # type: ignore[no-untyped-call]
            concise = mdates.ConciseDateFormatter(  # type: ignore[no-untyped-call]
                locator, formats=DATE_FORMATS, zero_formats=ZERO_DATE_FORMATS, offset_formats=OFFSET_DATE_FORMATS)
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(concise)
            labels = concise.format_ticks(ax.get_xticks())  # type: ignore[no-untyped-call]
            if len(set(labels)) < len(labels):  # hours over more than a day: "12:00" twice; say the day too
                fewer = mdates.AutoDateLocator(minticks=2, maxticks=5)  # type: ignore[no-untyped-call]
                ax.xaxis.set_major_locator(fewer)
                ax.xaxis.set_major_formatter(mdates.DateFormatter("%b %d %H:%M"))  # type: ignore[no-untyped-call]
            if marked is not None:
                ax.axvline(marked, color="#9e9e9e", linestyle="--",
                           linewidth=1, label="this run")
        ax.yaxis.set_major_locator(ticker.MaxNLocator(nbins=5))
        digits = distinct_digits([float(t) for t in ax.get_yticks()])
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.{digits}g}"))
        ax.set_title(title, loc="left", wrap=True)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, color="#eeeeee")
        ax.legend(loc="best", fontsize=8, frameon=False)
        out = io.StringIO()
        fig.savefig(out, format="svg", metadata={"Date": None})
    svg = out.getvalue()
    return svg[svg.index("<svg"):]


def _day(seconds: float) -> float:
    """POSIX seconds as matplotlib's date number (days since its epoch)."""
    from matplotlib import dates as mdates
    return float(mdates.date2num(dt.datetime.fromtimestamp(seconds, dt.timezone.utc)))  # type: ignore[no-untyped-call]


def timestamp(when: str) -> float:
    """An ISO time from the history (2026-12-01T23:40:21Z) as POSIX seconds; nan when unreadable."""
    try:
        return dt.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return math.nan
