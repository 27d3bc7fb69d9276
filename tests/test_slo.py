"""The SLO's grammar, the verdict of one point, and the probe-then-bisect search
(launcher/run/slo.py; docs/slo.md)."""

from __future__ import annotations

import re

import pytest

from launcher.run import slo


def test_grammar_reads_limits_in_ms():
    lims = slo.parse("ttft_p99<=2s, itl_p90<30ms,e2el_mean<=1.5s,tpot_median<=40ms")
    assert [(x.metric, x.stat, x.op, x.value_ms) for x in lims] == [
        ("ttft", "p99", "<=", 2000.0), ("itl", "p90", "<", 30.0),
        ("e2el", "mean", "<=", 1500.0), ("tpot", "median", "<=", 40.0)]
    assert slo.text_of(lims) == "ttft_p99<=2s, itl_p90<30ms, e2el_mean<=1.5s, tpot_median<=40ms"


@pytest.mark.parametrize("text, says", [
    ("tbt_p99<=2s", "'tbt' is not a metric the sweep reports; use one of ttft, tpot, itl, e2el"),
    ("ttft_p99<=2", "'ttft_p99<=2' has no unit: write ttft_p99<=2ms or ttft_p99<=2s"),
    ("ttft_p95<=2s", "'p95' is not reported for ttft"),
    ("ttft_p99>=2s", "a latency limit is an upper bound: write ttft_p99<=2s"),
    ("ttft_p99=2s", "a latency limit is an upper bound"),
    ("ttft_p99<=2min", "'min' is not a unit of time here; use ms or s"),
    ("ttft_p99<=0s", "the limit must be a positive time"),
    ("ttft_p99<=2s,ttft_p99<=3s", "ttft_p99 is limited twice"),
    ("ttft_p99<=2s,", "an empty limit in the list"),
    ("", "no limits given"),
    ("fast please", "is not a limit"),
])
def test_a_wrong_limit_is_one_sentence(text, says):
    with pytest.raises(ValueError) as e:
        slo.parse(text)
    msg = str(e.value)
    assert says in msg
    assert "\n" not in msg and not re.search(r"\.\s+[A-Z]", msg)  # one sentence


def _point(c, **kw):
    base = {"max_concurrency": c, "status": "ok", "failure_reason": None,
            "total_output_tokens": 100, "p99_ttft_ms": 900.0, "p90_itl_ms": 20.0}
    return {**base, **kw}


def test_a_point_passes_only_when_clean_and_under_every_limit():
    lims = slo.parse("ttft_p99<=1s,itl_p90<=25ms")
    assert slo.judge(_point(8), lims).passed
    over = slo.judge(_point(8, p90_itl_ms=31.0), lims)
    assert not over.passed and over.broken == ("itl_p90 31 ms over itl_p90<=25ms",)
    # failures other than latency are never passing, however fast the point was
    errs = slo.judge(_point(8, status="failed", failure_reason="3 request(s) failed"), lims)
    assert not errs.passed and errs.failure == "3 request(s) failed"
    zero = slo.judge(_point(8, total_output_tokens=0), lims)
    assert not zero.passed and zero.failure == "zero output tokens generated"
    gate = slo.judge(_point(8), lims, failure="accuracy gate failed")
    assert not gate.passed and gate.why == "accuracy gate failed"
    missing = slo.judge({k: v for k, v in _point(8).items() if k != "p90_itl_ms"}, lims)
    assert not missing.passed and "itl_p90 is not in the result" in missing.why


def _search(knee: int, first: int, top: int, precision: float) -> dict[int, bool]:
    tried: dict[int, bool] = {}
    while (c := slo.next_concurrency(tried, first, top, precision)) is not None:
        assert c not in tried and 1 <= c <= top
        tried[c] = c <= knee
    return tried


@pytest.mark.parametrize("precision", [0.0, 0.05, 0.1, 0.25])
@pytest.mark.parametrize("first, top", [(1, 64), (4, 512), (64, 5120), (3, 100)])
def test_search_finds_the_knee_within_the_precision(first, top, precision):
    for knee in range(0, top + 8):
        tried = _search(knee, first, top, precision)
        b = slo.bracket(tried)
        if knee >= top:  # everything passes: the top is the answer
            assert b == slo.Bracket(top, None)
            continue
        if knee < 1:
            assert b.passing is None and b.failing == 1
            continue
        assert b.passing is not None and b.failing is not None
        assert b.passing <= knee < b.failing
        assert b.failing - b.passing <= slo.step(b.passing, precision)
        # probes before the first fail are the plan's ladder
        assert [c for c in slo.ladder(first, top) if c in tried][:1] == [first]
        # few points: the doubling ladder, then a bisection
        assert len(tried) <= len(slo.ladder(first, top)) + top.bit_length() + 1


def test_search_probes_by_doubling_then_bisects():
    tried = {}
    seen = []
    while (c := slo.next_concurrency(tried, 4, 512, 0.1)) is not None:
        seen.append(c)
        tried[c] = c <= 40
    assert seen == [4, 8, 16, 32, 64, 48, 40, 44]
    assert slo.outcome(tried, 512, 0.1) == (
        "40 is the largest concurrency that meets every limit (44 fails; within 4, the "
        "precision 0.1)")


def test_outcome_when_nothing_or_everything_passes():
    assert slo.outcome(_search(0, 8, 64, 0.1), 64, 0.1) == (
        "no concurrency met every limit (down to 1)")
    assert "the top of the search (slo.max_concurrency 64" in slo.outcome(
        _search(100, 8, 64, 0.1), 64, 0.1)


def test_status_says_where_the_search_is():
    from launcher.text import progress_text

    assert progress_text({"sweep": {"index": 5, "total": None, "concurrency": 48,
                                    "search": "bisect"}}) == "SLO search point 5 (bisects, c=48)"
