"""Bottleneck verdicts: synthetic runs with one signature each get that verdict (through the
real chain: store -> loaders -> per-point derivation -> rules), and the rules' edges."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import synth

from launcher.analysis import derive, diagnose, load


def verdicts_of(run: Path) -> list[diagnose.Verdict]:
    plan, _ = load.read_plan_safe(run)
    ss = derive.SeriesSet(load.read_telemetry(run, names=load.TTFT_NAMES), plan)
    table = derive.point_table(load.load_bench(run), plan, ss)
    return diagnose.diagnose(table.to_dict("records"))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("diag")


@pytest.mark.parametrize("make, kind", [
    (synth.prefill_bound, diagnose.PREFILL),
    (synth.kv_capacity_bound, diagnose.KV_CAPACITY),
    (synth.kv_transfer_bound, diagnose.KV_TRANSFER),
])
def test_signature_gets_its_verdict(root, make, kind):
    vs = verdicts_of(make(root))
    top = vs[-1]  # the highest concurrency shows the bottleneck most clearly
    assert top.kind == kind, (top.kind, top.evidence)
    assert top.title == diagnose.TITLES[kind]
    assert top.evidence and all(isinstance(e, str) for e in top.evidence)
    # Evidence carries numbers with units, not just a label.
    assert any(u in " ".join(top.evidence) for u in ("ms", " s", "%"))
    # The lowest point of every signature is still healthy: the rules are not trigger-happy.
    assert vs[0].kind == diagnose.HEALTHY, (vs[0].kind, vs[0].evidence)


def test_healthy_run_is_healthy_everywhere(root):
    vs = verdicts_of(synth.healthy(root))
    assert [v.kind for v in vs] == [diagnose.HEALTHY] * 4


def test_kv_capacity_evidence_names_the_numbers(root):
    top = verdicts_of(synth.kv_capacity_bound(root))[-1]
    text = " ".join(top.evidence)
    assert "decode KV usage max" in text and "≥ 90%" in text
    assert "preemptions" in text


def test_failed_point_is_reported_as_failed(root):
    vs = verdicts_of(synth.failed(root))
    assert vs[-1].kind == diagnose.FAILED
    assert "decode-0 stopped answering" in vs[-1].evidence[0]
    assert vs[0].kind == diagnose.HEALTHY


def row(**kw) -> dict:
    base = dict(point="c=64", concurrency=64.0, status="ok", ttft_mean_s=1.0,
                tpot_mean_s=0.02, prefill_queue_s=0.05, prefill_compute_s=0.3,
                kv_transfer_s=0.05, decode_admission_s=0.01, remainder_s=0.59,
                decode_kv_max=0.5, decode_waiting_capacity=0.0, preemptions=0.0,
                nixl_failed=0.0, completed=100.0, failed=0.0)
    base.update(kw)
    return base


def test_client_router_when_engines_explain_little():
    v = diagnose.diagnose([row()])[0]
    assert v.kind == diagnose.CLIENT
    assert "59%" in v.evidence[0]


def test_no_telemetry_is_unknown_not_healthy():
    nan = math.nan
    v = diagnose.diagnose([row(prefill_queue_s=nan, prefill_compute_s=nan, kv_transfer_s=nan,
                               decode_admission_s=nan, remainder_s=nan, decode_kv_max=nan,
                               preemptions=nan, decode_waiting_capacity=nan,
                               nixl_failed=nan)])[0]
    assert v.kind == diagnose.UNKNOWN


def test_small_ttft_parts_do_not_trigger():
    # 40 % of a 100 ms TTFT is queueing, but 40 ms is below the 100 ms floor.
    v = diagnose.diagnose([row(ttft_mean_s=0.1, prefill_queue_s=0.04, prefill_compute_s=0.05,
                               kv_transfer_s=0.005, decode_admission_s=0.0,
                               remainder_s=0.005)])[0]
    assert v.kind == diagnose.HEALTHY


def test_full_kv_without_pressure_is_not_capacity():
    # KV at 95 % but nobody waits and nothing is preempted: the cache is used, not short.
    v = diagnose.diagnose([row(decode_kv_max=0.95, remainder_s=0.1)])[0]
    assert v.kind != diagnose.KV_CAPACITY


def test_decode_compute_needs_tpot_growth_without_kv_pressure():
    rows = [row(point="c=8", tpot_mean_s=0.02, remainder_s=0.1),
            row(point="c=64", tpot_mean_s=0.05, remainder_s=0.1)]
    vs = diagnose.diagnose(rows)
    assert vs[0].kind == diagnose.HEALTHY
    assert vs[1].kind == diagnose.DECODE_COMPUTE
    assert "2.5×" in vs[1].evidence[0]


def test_thresholds_are_adjustable():
    r = row(prefill_queue_s=0.2, remainder_s=0.39)
    assert diagnose.diagnose([r])[0].kind != diagnose.PREFILL
    th = diagnose.Thresholds(share=0.15, remainder_share=0.9)
    assert diagnose.diagnose([r], th)[0].kind == diagnose.PREFILL


def test_one_hot_decode_engine_is_imbalance():
    v = diagnose.diagnose([row(decode_kv_max=0.85, decode_kv_mean=0.40, remainder_s=0.1)])[0]
    assert v.kind == diagnose.IMBALANCE
    assert "85%" in v.evidence[0] and "40%" in v.evidence[0]
    # Balanced engines at the same peak: no imbalance.
    v = diagnose.diagnose([row(decode_kv_max=0.85, decode_kv_mean=0.80, remainder_s=0.1)])[0]
    assert v.kind == diagnose.HEALTHY
