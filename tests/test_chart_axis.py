"""A Pareto chart's tok/s-per-user axis never shows one label twice: its format has the
decimals that Vega's tick step needs, whatever the span of the points."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dashboard.charts import _fine_axis


def vega_ticks(lo: float, hi: float, count: int) -> list[float]:
    """The ticks Vega (d3-array's ticks) draws on [lo, hi] for a tick count."""
    step0 = (hi - lo) / count
    power = math.floor(math.log10(step0))
    error = step0 / 10 ** power
    step = 10 ** power * (10 if error >= 50 ** 0.5 else 5 if error >= 10 ** 0.5
                          else 2 if error >= 2 ** 0.5 else 1)
    first, last = math.ceil(lo / step), math.floor(hi / step)
    return [i * step for i in range(first, last + 1)]


def d3_format(fmt: str, x: float) -> str:
    """',.Nf' with '~' (trailing zeros trimmed), as d3-format writes it."""
    decimals = int(fmt.split(".")[1].rstrip("~f"))
    s = f"{x:,.{decimals}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


@pytest.mark.parametrize("lo, hi", [(82.80, 82.84), (82.043, 82.9), (0.011, 0.019),
                                    (1.0, 9.5), (12.0, 480.0), (1000.0, 1000.4),
                                    (3.0, 52_000.0)])
def test_every_tick_label_differs_from_its_neighbours(lo, hi):
    axis = _fine_axis(pd.Series([lo, (lo + hi) / 2, hi])).to_dict()
    labels = [d3_format(axis["format"], t) for t in vega_ticks(lo, hi, axis["tickCount"])]
    assert len(labels) >= 2 and len(set(labels)) == len(labels), (axis, labels)


def test_one_point_has_four_significant_digits():
    assert _fine_axis(pd.Series([82.043590])).to_dict() == {"format": ",.4~r"}
