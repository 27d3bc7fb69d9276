"""Headline figures against hand-computed numbers, with the per-GPU denominators named.

Topologies, stated explicitly (each prefill endpoint is DEP2 = 2 GPUs, the decode endpoint
is DEP8 = 8 GPUs over 2 GB200 nodes):

- 4 prefill x DEP2 + 1 decode x DEP8:  4*2 = 8 prefill GPUs + 8 decode GPUs = 16 GPUs.
- 8 prefill x DEP2 + 1 decode x DEP8:  8*2 = 16 prefill GPUs + 8 decode GPUs = 24 GPUs.

Issue 5 says "4-prefill x DEP2 + 1-decode DEP8 (24 GPUs)"; the arithmetic gives 16 for four
prefill endpoints, and 24 is the seed's upper end (8 prefill endpoints). Both are checked.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers import plan_doc

from launcher.run import figures
from launcher.run.results import load_results
from launcher.run.rundir import RunDir, RunRecord
from launcher.run.vocab import State


def _plan(n_prefill: int, *, engine: str = "vllm"):
    return plan_doc(n_prefill, engine=engine)


def _point(conc: int = 256, **kw) -> dict:
    """640 requests of ISL/OSL 8192/1024 in 100 s; median TPOT 20 ms."""
    p = {"date": "20261129-101500", "backend": "openai", "num_prompts": 640,
         "max_concurrency": conc, "duration": 100.0, "completed": 640, "failed": 0,
         "total_input_tokens": 640 * 8192, "total_output_tokens": 640 * 1024,
         "request_throughput": 6.4, "output_throughput": 6553.6,
         "total_token_throughput": 58982.4,
         "mean_ttft_ms": 950.0, "median_ttft_ms": 900.0, "p50_ttft_ms": 900.0,
         "p90_ttft_ms": 1500.0, "p99_ttft_ms": 2500.0,
         "mean_tpot_ms": 21.0, "median_tpot_ms": 20.0, "p50_tpot_ms": 20.0,
         "p90_tpot_ms": 25.0, "p99_tpot_ms": 40.0,
         "status": "ok", "failure_reason": None, "driver": "builtin",
         "window_start": 1000.0, "window_end": 1100.0}
    p.update(kw)
    return p


def test_headline_figures_for_8_prefill_dep2_plus_dep8_decode_24_gpus() -> None:
    den = figures.gpu_denominators(_plan(8))
    assert den == {"gpus_total": 24, "gpus_prefill": 16, "gpus_decode": 8, "gpus_agg": 0}
    f = figures.point_figures(_point(), den)
    assert f["denominators"] == {"gpus_total": 24, "gpus_prefill": 16, "gpus_decode": 8}
    # (5,242,880 in + 655,360 out) / 100 s = 58,982.4 tok/s; / 24 GPUs = 2,457.6
    assert f["total_token_throughput"] == pytest.approx(58982.4)
    assert f["total_tokens_per_s_per_gpu"] == pytest.approx(2457.6)
    # 655,360 / 100 s = 6,553.6 tok/s over 8 decode GPUs = 819.2
    assert f["output_tokens_per_s_per_decode_gpu"] == pytest.approx(819.2)
    # 5,242,880 / 100 s = 52,428.8 tok/s over 16 prefill GPUs = 3,276.8
    assert f["input_tokens_per_s_per_prefill_gpu"] == pytest.approx(3276.8)
    # srt-slurm's output figure divides by every GPU: 6,553.6 / 24
    assert f["output_tokens_per_s_per_gpu"] == pytest.approx(273.0667, rel=1e-4)
    assert f["tokens_per_s_per_user"] == pytest.approx(50.0)  # 1000 / 20 ms
    assert f["request_throughput"] == pytest.approx(6.4)
    assert (f["ttft_p50_ms"], f["ttft_p90_ms"], f["ttft_p99_ms"]) == (900.0, 1500.0, 2500.0)
    assert (f["tpot_p50_ms"], f["tpot_p90_ms"], f["tpot_p99_ms"]) == (20.0, 25.0, 40.0)
    assert f["not_applicable"] == {}


def test_headline_figures_for_4_prefill_dep2_plus_dep8_decode_16_gpus() -> None:
    plan = _plan(4)
    den = figures.gpu_denominators(plan)
    assert den["gpus_total"] == 16 and den["gpus_prefill"] == 8 and den["gpus_decode"] == 8
    # without gpu_count (older plan) the same numbers come from the endpoints
    f = figures.point_figures(_point(), den)
    assert f["total_tokens_per_s_per_gpu"] == pytest.approx(58982.4 / 16)  # 3,686.4
    assert f["input_tokens_per_s_per_prefill_gpu"] == pytest.approx(52428.8 / 8)  # 6,553.6
    assert f["output_tokens_per_s_per_decode_gpu"] == pytest.approx(819.2)


def test_aggregated_mode_has_no_prefill_or_decode_split() -> None:
    plan = plan_doc(agg=1)
    f = figures.point_figures(_point(), figures.gpu_denominators(plan), mode="agg")
    assert f["denominators"] == {"gpus_total": 8}
    assert f["total_tokens_per_s_per_gpu"] == pytest.approx(58982.4 / 8)
    assert f["output_tokens_per_s_per_decode_gpu"] is None
    assert f["input_tokens_per_s_per_prefill_gpu"] is None
    assert "aggregated" in f["not_applicable"]["output_tokens_per_s_per_decode_gpu"]


def test_missing_percentiles_come_from_detailed_arrays_or_say_why() -> None:
    den = figures.gpu_denominators(_plan(4))
    p = _point()
    for k in ("p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p90_tpot_ms",
              "p99_tpot_ms", "median_tpot_ms", "median_ttft_ms"):
        del p[k]
    f = figures.point_figures(p, den)
    assert f["ttft_p90_ms"] is None and "--metric-percentiles" in f["not_applicable"][
        "ttft_p90_ms"]
    assert f["tokens_per_s_per_user"] is None
    # --save-detailed arrays (seconds): TTFT 0.1..0.5 s; TPOT = (latency - ttft)/(tokens - 1)
    p.update({"ttfts": [0.1, 0.2, 0.3, 0.4, 0.5], "latencies": [1.1, 2.2, 3.3, 4.4, 5.5],
              "output_lens": [11, 11, 11, 11, 11], "errors": ["", "", "", "", ""]})
    f = figures.point_figures(p, den)
    assert f["ttft_p50_ms"] == pytest.approx(300.0)
    assert f["ttft_p90_ms"] == pytest.approx(460.0)  # linear: 0.4 + 0.6 * 0.1 s
    assert f["tpot_p50_ms"] == pytest.approx(300.0)  # (3.3 - 0.3) / 10 s
    assert f["tokens_per_s_per_user"] == pytest.approx(1000 / 300)


def _write_run(tmp_path: Path, *, accuracy: float | None, engine: str = "sim",
               state: State = State.SUCCEEDED) -> Path:
    run = tmp_path / "runs" / "20261129-120000-qwen35"
    (run / "bench").mkdir(parents=True)
    RunDir(run).write_record(RunRecord(state=state, started=1.0, ended=2.0))
    doc = dataclasses.replace(_plan(8, engine=engine), processes=[
        p for p in _plan(8, engine=engine).processes if p.kind != "bench"])  # points as below
    (run / "plan.json").write_text(json.dumps(doc.to_json()))
    (run / "bench" / "c64.json").write_text(json.dumps(_point(64, duration=200.0)))
    (run / "bench" / "c256.json").write_text(json.dumps(_point(256)))
    zero = _point(1024, total_output_tokens=0, status="failed",
                  failure_reason="zero output tokens generated", duration=1.0)
    (run / "bench" / "c1024.json").write_text(json.dumps(zero))
    if accuracy is not None:
        (run / "accuracy").mkdir()
        (run / "accuracy" / "gsm8k.json").write_text(json.dumps(
            {"task": "gsm8k", "accuracy": accuracy, "threshold": 0.88,
             "passed": accuracy >= 0.88, "num_questions": 40, "num_shots": 5,
             "invalid_rate": 0.0, "timestamp": 1.0}))
    return run


def test_summary_marks_failed_points_and_the_accuracy_gate(tmp_path: Path) -> None:
    run = _write_run(tmp_path, accuracy=0.125)
    s = figures.write_summary(run)
    assert [p["max_concurrency"] for p in s["points"]] == [64, 256, 1024]
    assert [p["status"] for p in s["points"]] == ["ok", "ok", "failed"]
    # the zero-token point is failed and is never the headline, although its duration is
    # tiny and its input-token rate is enormous
    assert s["headline"]["max_concurrency"] == 256
    assert s["headline"]["total_tokens_per_s_per_gpu"] == pytest.approx(2457.6)
    assert s["verdict"] == "failed"
    assert any("0.125 is below the threshold 0.88" in r for r in s["verdict_reasons"])
    assert any("max_concurrency=1024 failed: zero output tokens" in r
               for r in s["verdict_reasons"])
    assert s["simulated"] is True
    assert all("simulated" in p["labels"] and "accuracy-gate-failed" in p["labels"]
               for p in s["points"])
    assert s["denominators"] == {"gpus_total": 24, "gpus_prefill": 16, "gpus_decode": 8}
    # re-reading the files reproduces the summary that was written
    on_disk = json.loads((run / "summary.json").read_text())
    again = figures.summary(run)
    on_disk.pop("generated")
    again.pop("generated")
    assert again == on_disk


def test_summary_passes_when_every_point_and_the_gate_pass(tmp_path: Path) -> None:
    run = _write_run(tmp_path, accuracy=0.9, engine="vllm")
    (run / "bench" / "c1024.json").unlink()
    s = figures.summary(run)
    assert s["verdict"] == "passed" and s["verdict_reasons"] == []
    assert s["accuracy"]["passed"] is True and s["simulated"] is False
    assert len(load_results(run)) == 2


def test_table_shows_denominators_failures_and_verdict(tmp_path: Path) -> None:
    from rich.console import Console

    run = _write_run(tmp_path, accuracy=0.125)
    console = Console(record=True, width=160)
    figures.render_table(figures.summary(run), console=console)
    text = console.export_text()
    assert "total 24, prefill 16, decode 8" in text
    assert "SIMULATED" in text
    assert "FAILED" in text and "zero output tokens" in text
    assert "2,458" in text  # total tok/s/GPU at c256
    assert "0.125" in text and "verdict: failed" in text


def test_figures_cli_on_a_missing_dir_is_one_sentence(tmp_path: Path, capsys) -> None:
    assert figures.main([str(tmp_path / "nope")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_figures_cli_prints_the_table_and_writes_the_summary(tmp_path: Path, capsys) -> None:
    run = _write_run(tmp_path, accuracy=0.9, state=State.FAILED)  # c1024 failed: so did the run
    assert figures.main([str(run), "--write"]) == 0
    out = capsys.readouterr().out
    assert "2,458" in out and "verdict: failed" in out  # c1024 is a failed point
    assert json.loads((run / "summary.json").read_text())["verdict"] == "failed"
