"""One way to write a number for a person (issue 41 item 10): launcher.numbers."""

from __future__ import annotations

import math

from launcher.analysis import compare
from launcher.run import numbers


def test_a_number_is_written_one_way():
    n = numbers.number
    assert n(10276.9763) == "10,277" and n(7821) == "7,821"
    assert n(148.14) == "148" and n(48.61) == "48.6" and n(6.754) == "6.75"
    assert n(0.733) == "0.733" and n(0.0705) == "0.0705" and n(0) == "0"
    assert n(1_000_000) == "1,000,000" and n(-0.0001, 1) == "0.0"
    assert n(3102.5976, 1) == "3,102.6" and n(12.5, unit="ms") == "12.5 ms"
    for nothing in (None, math.nan, math.inf, "x", True):
        assert n(nothing) == numbers.MISSING
    assert numbers.signed_pct(-23.91) == "-23.9 %" and numbers.signed_pct(None) == "—"


def test_diff_writes_figures_with_the_one_formatter():
    r = {"a": "A", "b": "B", "settings": [], "drift": [], "processes": [],
         "single_variable": False, "repeats": {"a": [], "b": []},
         "figures": [{"concurrency": 64, "figure": "tok/s/working GPU", "a": 10276.9763,
                      "b": 7821.0, "change_pct": -23.9, "spread_pct": None,
                      "outside_spread": None},
                     {"concurrency": None, "figure": "accuracy", "a": 0.733, "b": 0.7,
                      "change_pct": -4.5, "spread_pct": 2.0, "outside_spread": True}]}
    text = compare.text(r)
    assert "c=64 tok/s/working GPU: 10,277 -> 7,821 (-23.9 %)" in text, text
    assert "accuracy: 0.733 -> 0.700 (-4.5 %), outside the run-to-run spread (2.0 %)" in text
    assert "e+" not in text
