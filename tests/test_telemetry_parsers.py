"""The /metrics and stats-log parsers on the exact vLLM 0.33 fixtures: concrete values per
engine, old-name mapping, and agreement with prometheus_client's own parser."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import FIXTURES

from launcher.telemetry.scrape import (
    RENAMES,
    MetricsParser,
    canonical_name,
    parse_metrics,
    samples_by,
    split_line,
)
from launcher.telemetry.statslog import (
    LOG_FIELDS,
    LogTail,
    StatsLogParser,
    parse_kv_transfer,
    parse_log_text,
    parse_stats_body,
)

FIX = FIXTURES
DECODE = FIX / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl.prom"
MULTI = FIX / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl_multiproc.prom"
PREFILL = FIX / "vllm_metrics_v0.33.0_generated_prefill_dp2_nixl.prom"
LOG_DECODE = FIX / "vllm_server_v0.33.0_generated_decode_dp4_nixl.log"
LOG_AGG = FIX / "vllm_server_v0.33.0_generated_decode_dp4_nixl_aggregated.log"
LOG_PREFILL = FIX / "vllm_server_v0.33.0_generated_prefill_dp2_nixl.log"
LOG_MULTI = FIX / "vllm_server_v0.33.0_generated_multi_api_server_warning.log"
NOW = 1796000000.0  # 2026-12: fixes the year the month-day log stamps are read in


def one(samples, name, engine=None, **labels) -> float:
    got = samples_by(samples, name, engine, **labels)
    assert len(got) == 1, (name, engine, labels, got)
    return got[0].value


def test_decode_fixture_values_per_engine() -> None:
    s = parse_metrics(DECODE.read_text())
    assert one(s, "vllm:kv_cache_usage_perc", "0") == 0.5323073046384119
    assert one(s, "vllm:kv_cache_usage_perc", "1") == 0.487344709177123
    assert one(s, "vllm:num_requests_running", "0") == 89.0
    assert one(s, "vllm:num_requests_running", "1") == 96.0
    assert one(s, "vllm:num_requests_waiting_by_reason", "1", reason="capacity") == 1.0
    assert one(s, "vllm:num_requests_waiting_by_reason", "1", reason="deferred") == 4.0
    assert one(s, "vllm:num_requests_kv_fetch_by_stage", "1", stage="in_progress") == 2.0
    assert one(s, "vllm:prompt_tokens_by_source_total", "0",
               source="external_kv_transfer") == 1302369.0
    assert one(s, "vllm:generation_tokens_total", "1") == 68419.0
    assert one(s, "vllm:nixl_xfer_time_seconds_count", "0") == 636.0
    assert one(s, "vllm:nixl_bytes_transferred_sum", "1") == 1.0890510336e11
    assert one(s, "vllm:time_to_first_token_seconds_sum", "0") == 150.85636204124802
    # histogram buckets keep their `le`, verbatim, engine moved out of the labels
    b = samples_by(s, "vllm:time_to_first_token_seconds_bucket", "1")
    assert len(b) == 23
    assert {x.labels for x in b if json.loads(x.labels)["le"] == "+Inf"} == {
        '{"le":"+Inf","model_name":"nvidia/Qwen3.5-397B-A17B-NVFP4"}'}
    assert one(s, "vllm:time_to_first_token_seconds_bucket", "1", le="+Inf") == 149.0
    assert one(s, "vllm:time_to_first_token_seconds_bucket", "1", le="0.25") == 0.0
    info = samples_by(s, "vllm:cache_config_info", "0")
    assert json.loads(info[0].labels)["num_gpu_blocks"] == "2731"
    assert one(s, "process_cpu_seconds_total", "") == 1.1400000000000001
    assert not [x for x in s if x.name.endswith("_created")]
    assert not [x for x in s if "engine" in json.loads(x.labels)]


def test_prefill_fixture_values() -> None:
    s = parse_metrics(PREFILL.read_text())
    assert one(s, "vllm:nixl_num_kv_expired_reqs_total", "0") == 5.0
    assert one(s, "vllm:nixl_num_kv_expired_reqs_total", "1") == 6.0
    assert one(s, "vllm:num_requests_waiting_by_reason", "0", reason="capacity") == 30.0
    assert one(s, "vllm:prompt_tokens_by_source_total", "1", source="local_cache_hit") == 181632.0
    assert one(s, "vllm:time_to_first_token_seconds_count", "0") == 119.0
    assert one(s, "vllm:nixl_xfer_time_seconds_count", "1") == 0.0
    assert not samples_by(s, "vllm:num_requests_kv_fetch_by_stage")  # producer role


def test_multiprocess_fixture() -> None:
    s = parse_metrics(MULTI.read_text())
    assert one(s, "vllm:kv_cache_usage_perc", "1") == 0.41088056682581137
    assert one(s, "vllm:time_to_first_token_seconds_count", "0") == 296.0
    assert one(s, "vllm:time_to_first_token_seconds_bucket", "1", le="+Inf") == 317.0
    assert one(s, "vllm:nixl_xfer_time_seconds_count", "1") == 1268.0
    assert one(s, "vllm:num_requests_kv_fetch_by_stage", "0", stage="completed_waiting") == 1.0
    assert not samples_by(s, "process_cpu_seconds_total")


@pytest.mark.parametrize("path", [DECODE, MULTI, PREFILL], ids=["decode", "multi", "prefill"])
def test_agrees_with_prometheus_client(path: Path) -> None:
    """Same samples and values as the reference parser (minus the dropped `_created`)."""
    from prometheus_client.parser import text_string_to_metric_families

    ref = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for smp in fam.samples:
            if smp.name.endswith("_created"):
                continue
            labels = dict(smp.labels)
            engine = labels.pop("engine", "")
            ref[(smp.name, engine, json.dumps(labels, sort_keys=True,
                                               separators=(",", ":")))] = smp.value
    ours = {(x.name, x.engine, x.labels): x.value for x in parse_metrics(path.read_text())}
    assert ours.keys() == ref.keys()
    for k, v in ref.items():
        assert ours[k] == v or (math.isnan(v) and math.isnan(ours[k])), k


def test_old_names_map_to_033_names() -> None:
    old = (
        '# TYPE vllm:gpu_cache_usage_perc gauge\n'
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:time_per_output_token_seconds_bucket{engine="0",le="0.05",model_name="m"} 7.0\n'
        'vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 9.0\n'
        'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 3.0\n'
        'vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 4.0\n'
        'vllm_router_requests_total{route="/v1/completions"} 12 1700000000000\n'
    )
    s = parse_metrics(old)
    assert one(s, "vllm:kv_cache_usage_perc", "0") == 0.25
    assert one(s, "vllm:inter_token_latency_seconds_bucket", "0", le="0.05") == 7.0
    assert one(s, "vllm:inter_token_latency_seconds_count", "0") == 9.0
    assert one(s, "vllm:prefix_cache_hits_total", "0") == 3.0
    # the per-request TPOT is a different metric and keeps its name
    assert one(s, "vllm:request_time_per_output_token_seconds_count", "0") == 4.0
    assert one(s, "vllm_router_requests_total", "", route="/v1/completions") == 12.0  # timestamp
    assert canonical_name("vllm:gpu_cache_usage_perc") == RENAMES["vllm:gpu_cache_usage_perc"]
    assert split_line('a{x="has space"} 1.5') == ('a{x="has space"}', "1.5")
    assert split_line("# HELP a b") is None


def test_label_escapes() -> None:
    s = parse_metrics('m{a="q\\"uote",b="back\\\\slash",engine="2"} 1\n')
    assert s[0].engine == "2"
    assert json.loads(s[0].labels) == {"a": 'q"uote', "b": "back\\slash"}


@pytest.mark.alone
def test_parser_is_much_faster_than_prometheus_client() -> None:
    import time

    from prometheus_client.parser import text_string_to_metric_families

    def best(f, n: int) -> float:  # the least of n timings: the one least disturbed
        times = []
        for _ in range(n):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return min(times)

    text = DECODE.read_text()
    ref = best(lambda: sum(len(f.samples) for f in text_string_to_metric_families(text)), 5)
    p = MetricsParser()
    p.parse(text)
    ours = best(lambda: p.parse(text), 10)
    assert ref / ours > 10, (ref, ours)


# --- stats log -------------------------------------------------------------------------------

def log_one(samples, name, engine) -> list[float]:
    return [x.value for x in samples if x.name == name and x.engine == engine]


def test_decode_log_every_field_and_kv_transfer_per_engine() -> None:
    s = parse_log_text(LOG_DECODE.read_text(), now=NOW)
    assert {x.engine for x in s} == {"0", "1", "2", "3"}
    assert log_one(s, "log:generation_throughput_tok_s", "0") == [2279.4, 2248.7, 2272.5]
    assert log_one(s, "log:running_reqs", "1") == [77.0, 76.0, 74.0]
    assert log_one(s, "log:deferred_reqs", "0") == [1.0, 4.0]  # absent in the first line
    assert log_one(s, "log:kv_fetch_waiting_to_start", "1") == [2.0, 1.0, 2.0]
    assert log_one(s, "log:kv_fetch_in_progress", "2") == [3.0, 1.0, 3.0]
    assert log_one(s, "log:kv_fetch_completed_waiting", "3") == [1.0, 1.0, 1.0]
    assert log_one(s, "log:kv_cache_usage_pct", "3") == [40.0, 71.3, 78.6]
    assert log_one(s, "log:external_prefix_cache_hit_rate_pct", "2") == [100.0] * 3
    # the KV Transfer line belongs to the engine line before it
    assert log_one(s, "log:kv_num_successful_transfers", "0") == [208.0, 200.0, 268.0]
    assert log_one(s, "log:kv_num_successful_transfers", "3") == [192.0, 172.0, 204.0]
    assert log_one(s, "log:kv_avg_xfer_time_ms", "1") == [33.87, 30.933, 30.279]
    assert log_one(s, "log:kv_p90_xfer_time_ms", "2") == [55.354, 55.376, 53.605]
    assert log_one(s, "log:kv_throughput_mb_s", "3") == [5597.969, 5822.137, 5069.607]
    assert log_one(s, "log:kv_avg_num_descriptors", "0") == [2210.8, 2294.4, 2181.5]
    assert log_one(s, "log:kv_num_notifs_after_expiry", "1") == [0.0, 0.0, 0.0]
    first = next(x for x in s if x.engine == "0")
    import time
    assert time.strftime("%m-%d %H:%M:%S", time.localtime(first.ts)) == "11-29 11:00:09"
    assert not [x for x in s if x.name == "log:preemptions"]  # optional, absent here


def test_prefill_log_kv_transfer_attaches_to_the_right_engine() -> None:
    s = parse_log_text(LOG_PREFILL.read_text(), now=NOW)
    assert log_one(s, "log:prompt_throughput_tok_s", "0") == [26009.6, 29523.2, 22732.8]
    assert log_one(s, "log:prefix_cache_hit_rate_pct", "1") == [22.4, 22.0, 19.0]
    # 11:00:20: engine 000 printed no KV line; the one after engine 001 is engine 1's
    assert log_one(s, "log:kv_num_expired_reqs", "0") == [3.0, 2.0]
    assert log_one(s, "log:kv_num_expired_reqs", "1") == [2.0, 4.0]
    assert log_one(s, "log:kv_avg_xfer_time_ms", "0") == [0.0, 0.0]
    assert not log_one(s, "log:deferred_reqs", "0")


def test_aggregated_log() -> None:
    s = parse_log_text(LOG_AGG.read_text(), now=NOW)
    assert {x.engine for x in s} == {""}
    assert {tuple(x.labels.items()) for x in s} == {(("aggregated_engines", "4"),)}
    assert log_one(s, "log:num_gpu_blocks", "") == [2731.0]
    assert log_one(s, "log:running_reqs", "") == [279.0, 318.0, 208.0]
    assert log_one(s, "log:kv_cache_usage_pct", "") == [48.1, 57.5, 65.3]
    assert log_one(s, "log:kv_num_successful_transfers", "") == [816.0, 796.0, 864.0]
    assert log_one(s, "log:kv_avg_mb_per_transfer", "") == [168.199, 174.347, 171.354]


def test_multi_api_server_warning_is_a_notice() -> None:
    p = StatsLogParser(now=NOW)
    out = [x for line in LOG_MULTI.read_text().splitlines() for x in p.feed(line)]
    assert out == []
    assert len(p.notices) == 2 and "api_server_count > 1" in p.notices[0]


def test_optional_fields_and_variants() -> None:
    body = ("Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
            "Running: 3 reqs, Waiting: 4 reqs, Preemptions: 5, GPU KV cache usage: n/a, "
            "Prefix cache hit rate: 6.5%, Corrupted: 1 reqs, MM cache hit rate: 7.0%")
    f = parse_stats_body(body)
    assert f == {"prompt_throughput_tok_s": 1.0, "generation_throughput_tok_s": 2.0,
                 "running_reqs": 3.0, "waiting_reqs": 4.0, "preemptions": 5.0,
                 "prefix_cache_hit_rate_pct": 6.5, "corrupted_reqs": 1.0,
                 "mm_cache_hit_rate_pct": 7.0}
    assert set(f) <= set(LOG_FIELDS)
    kv = parse_kv_transfer("Num successful transfers=4, Avg xfer time (ms)=1.381, "
                           "Num failed recvs=2")
    assert kv == {"kv_num_successful_transfers": 4.0, "kv_avg_xfer_time_ms": 1.381,
                  "kv_num_failed_recvs": 2.0}
    # older prefix without "(Proc pid=N)" and the KVConnectorType variant
    p = StatsLogParser(now=NOW)
    a = p.feed("INFO 11-29 10:00:00 [loggers.py:123] Engine 007: Avg prompt throughput: 1.0 "
               "tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 "
               "reqs, GPU KV cache usage: 5.0%")
    b = p.feed("INFO 11-29 10:00:00 [metrics.py:98] KVConnectorType: NixlConnector, KV Transfer "
               "metrics: Num successful transfers=9")
    assert {x.engine for x in a + b} == {"7"}
    assert b[0].value == 9.0


def test_tail_partial_lines_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "decode-0@n1.log"
    tail = LogTail(log)
    assert list(tail.poll()) == []  # not there yet
    lines = LOG_DECODE.read_text().splitlines(keepends=True)
    with open(log, "w") as f:
        f.write(lines[0])
        f.write(lines[1][:40])  # a partial line
    got = list(tail.poll())
    assert got == [lines[0].rstrip("\n")]
    with open(log, "a") as f:
        f.write(lines[1][40:])
        f.write(lines[2])
    assert list(tail.poll()) == [lines[1].rstrip("\n"), lines[2].rstrip("\n")]
    # rotation: the writer appends to the old file, then it is renamed and a new one starts
    with open(log, "a") as f:
        f.write(lines[3])
    log.rename(tmp_path / "decode-0@n1.log.1")
    with open(log, "w") as f:
        f.write(lines[4])
    assert list(tail.poll()) == [lines[3].rstrip("\n"), lines[4].rstrip("\n")]
    assert tail.rotations == 1
    # copytruncate
    with open(log, "w") as f:
        f.write(lines[5])
    assert list(tail.poll()) == [lines[5].rstrip("\n")]
    assert tail.truncations == 1
    # everything fed through the parser gives engine 0..2's lines and their KV fields
    p = StatsLogParser(now=NOW)
    out = [x for line in lines[:6] for x in p.feed(line)]
    assert log_one(out, "log:kv_num_successful_transfers", "2") == [216.0]
    tail.close()


# --- the scraper's fused change-point path -----------------------------------------------------

def test_scrape_rows_reproduce_every_scrape_by_interpolation() -> None:
    """Rows from `TargetState.ingest` obey the store's rule: per series, linear interpolation
    between stored rows gives back every sampled value (buckets at their own cadence, plus
    their first sight and their last observation, which the flush writes: a histogram that
    appears or moves after the last bucket pass is not lost)."""
    import random

    import numpy as np

    from launcher.telemetry.scrape import Target, TargetState

    rng = random.Random(3)
    st = TargetState(Target("decode-0@n1", "u"), "n1", keyframe_s=20.0, bucket_every_s=3.0)
    keys = [f'vllm:g{i}{{engine="{i % 2}",model_name="m"}}' for i in range(6)]
    keys += [f'vllm:h_bucket{{engine="0",le="{b}",model_name="m"}}' for b in ("1.0", "+Inf")]
    late = [f'vllm:late_bucket{{engine="0",le="{b}",model_name="m"}}' for b in ("1.0", "+Inf")]
    vals = {k: 0.0 for k in keys + late}
    first_seen: dict[str, float] = {}
    truth: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    rows: list[str] = []
    bucket_times = []
    for i in range(120):
        ts = 1000.0 + i
        if i == 61:  # between two bucket passes
            keys += late
        for k in keys:
            first_seen.setdefault(k, ts)
            if rng.random() < (0.5 if i % 7 else 0.0):
                vals[k] += rng.randint(1, 3)
        text = "# HELP x\n" + "".join(f"{k} {vals[k]!r}\n" for k in keys) + \
            'vllm:g0_created{engine="0",model_name="m"} 17.0\n'
        if i == 0 or ts >= st.next_buckets or ts >= st.next_keyframe:
            bucket_times.append(ts)
        rows += st.ingest(ts, text)
        for k in keys:
            name, engine, labels = st.parser.key(k)
            truth.setdefault((name, engine, labels), []).append((ts, vals[k]))
    rows += st.pending()
    stored: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for r in rows:
        ts, node, proc, engine, name, labels, value = r.rstrip("\n").split("\t")
        assert (node, proc) == ("n1", "decode-0@n1")
        stored.setdefault((name, engine, labels), []).append((float(ts), float(value)))
    assert not [k for k in stored if k[0].endswith("_created")]
    assert 1061.0 not in bucket_times
    seen = {st.parser.key(k): t for k, t in first_seen.items()}
    for key, samples in truth.items():
        if key[0].endswith("_bucket"):
            samples = [s for s in samples if s[0] in bucket_times or s[0] == seen[key]] + \
                [samples[-1]]
        xs, ys = zip(*sorted(stored[key]), strict=True)
        tx, ty = zip(*samples, strict=True)
        assert np.allclose(np.interp(tx, xs, ys), ty), key
    assert len(rows) < len(truth) * 120  # it saved rows
