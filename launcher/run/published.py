"""The published Pareto as reference data, and how far a run is from it.

`launcher/data/published_pareto_qwen35_gb200.json` holds the points of Figure 1 of the vLLM
blog post "vLLM Reaches 25K Total TPS/GPU on Qwen3.5" (2026-08-06; repository
vllm-project/vllm-project.github.io, `_posts/2026-08-06-qwen35-25k-tps.md`), read off the
figure at about +-0.3k tok/s/GPU: the post publishes no table. Its y is total tok/s per
GPU; per working or per allocated GPU is not known (srt-slurm v1.0.32 divided by the
allocated GPUs, its PR #270 in v1.0.39 by the endpoints' GPUs): the ratios are taken per
working GPU and each row carries the per-allocated-GPU figure too (docs/workload.md).

A run is compared only when it is the published workload (`comparable`): disaggregated,
the model Qwen3.5-397B-A17B-NVFP4, sa-bench's workload (ISL/OSL 8192/1024 by its length
rule at range ratio 0.8, prompts in the chat template, output forced; docs/workload.md), one decode
endpoint DEP8 and N prefill endpoints DEP2 with N one of the published configurations, on
nodes of 4 GPUs (GB200 NVL72 trays). A simulated run is compared and labelled a
simulation; real vLLM on a CPU is never compared (not a GPU measurement).

Ratios (`ratios`): measured total tok/s per working GPU ÷ the published total tok/s/GPU at
the same configuration and max concurrency. Where the figure has no point at a measured
concurrency the row says so; nothing is interpolated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from launcher.run.lengths import RULE_TEXT
from launcher.run.plandoc import PlanDoc
from launcher.run.vocab import Kind, Role

DATA = Path(__file__).resolve().parents[1] / "data" / "published_pareto_qwen35_gb200.json"
MEASURE = "total_tokens_per_s_per_gpu"  # the run's figure compared: per working GPU
MODEL_MARK = "qwen3.5-397b-a17b"  # in the model path, case-insensitive
QUANT_MARK = "nvfp4"
GPUS_PER_NODE = 4  # a GB200 NVL72 tray


@dataclass(frozen=True)
class Match:
    """A run that is the published workload: its configuration in the reference data."""

    config: dict[str, Any]
    simulated: bool

    @property
    def name(self) -> str:
        return self.config["name"]


@lru_cache(maxsize=1)
def reference() -> dict[str, Any]:
    """The reference file as a dict (read once)."""
    return json.loads(DATA.read_text(encoding="utf-8"))


def configurations() -> list[dict[str, Any]]:
    return list(reference()["configurations"])


def config_by_prefill(n: int) -> dict[str, Any] | None:
    return next((c for c in configurations() if c["prefill_endpoints"] == n), None)


def precision_text() -> str:
    """'read off Figure 1 of the vLLM blog post (2026-08-06), about ±0.3k tok/s/GPU'."""
    ref = reference()
    k = ref["precision"]["tokens_per_s_per_gpu_abs"] / 1000
    return (f"read off Figure 1 of the vLLM blog post \"vLLM Reaches 25K Total TPS/GPU on "
            f"Qwen3.5\" ({ref['source']['date']}), about ±{k:g}k tok/s/GPU; not published "
            "as numbers")


def source_text() -> str:
    s = reference()["source"]
    return f"{s['repository']}, {s['path']}, Figure 1"


def comparable(plan: PlanDoc | None) -> tuple[Match | None, str]:
    """(the published configuration this run is, "") or (None, why it is not comparable)."""
    if plan is None:
        return None, "no readable plan.json"
    if plan.engine_kind.unlike_published:
        return None, plan.engine_kind.unlike_published
    if plan.mode != "disagg":
        return None, f"mode {plan.mode}: the published runs are disaggregated"
    model = plan.model_path.lower()
    if MODEL_MARK not in model or QUANT_MARK not in model:
        return None, (f"model {plan.model_path} is not {reference()['workload']['model']}")
    benches = plan.processes_of_kind(Kind.BENCH)
    if not benches:
        return None, "the plan has no benchmark client"
    if (plan.workload or {}).get("driver") == "custom":
        return None, "the benchmark is a custom command (benchmark.custom), not the sweep"
    differs = workload_differs(plan)
    if differs:
        return None, differs
    dec = [e for e in plan.endpoints if e.role == Role.DECODE]
    pre = [e for e in plan.endpoints if e.role == Role.PREFILL]
    if len(dec) != 1 or dec[0].dp_size != 8 or dec[0].tp_size != 1:
        return None, (f"decode is {len(dec)} x {dec[0].shape if dec else '–'}; the published "
                      "decode is 1 x DEP8")
    if not pre or any(e.dp_size != 2 or e.tp_size != 1 for e in pre):
        return None, "the published prefill endpoints are DEP2"
    if any(n.gpus != GPUS_PER_NODE for n in plan.nodes):
        return None, f"nodes of {GPUS_PER_NODE} GPUs (GB200 NVL72 trays) only"
    config = config_by_prefill(len(pre))
    if config is None:
        have = ", ".join(str(c["prefill_endpoints"]) for c in configurations())
        return None, f"{len(pre)} prefill endpoints: the published ones have {have}"
    return Match(config, plan.engine_kind.speed_modelled), ""


def workload_differs(plan: PlanDoc) -> str:
    """Where the run's workload is not the published one ("" when it is): ISL/OSL, the length
    rule, the range ratio, the chat template, output forced. A simulated engine cannot apply
    the template (no tokenizer) and counts its tokens inside the lengths: not a difference."""
    w = reference()["workload"]
    got = plan.workload
    if not got:  # written before plan.json recorded it: lengths by vLLM's rule then
        got = {"length_rule": "vllm", "input_len": None}
    out = []
    if (got.get("input_len"), got.get("output_len")) != (w["input_len"], w["output_len"]):
        out.append(f"ISL/OSL {got.get('input_len') or '?'}/{got.get('output_len') or '?'} is "
                   f"not the published {w['input_len']}/{w['output_len']}")
    if got.get("length_rule") != w["length_rule"]:
        out.append(f"lengths by {RULE_TEXT.get(got.get('length_rule'), 'an unknown rule')}, "
                   f"not {RULE_TEXT[w['length_rule']]} (sa-bench's)")
    elif got.get("driver") == "vllm":
        out.append("vllm bench serve draws by vLLM's rule (a window one token narrower than "
                   "sa-bench's)")
    if got.get("range_ratio") is not None and got["range_ratio"] != w["range_ratio"]:
        out.append(f"range ratio {got['range_ratio']:g}, not {w['range_ratio']:g}")
    if w["chat_template"] and not got.get("chat_template"):
        out.append("prompts without the chat template (the published ones are in it)")
    elif got.get("chat_template") and not got.get("chat_template_applied") \
            and plan.engine_kind.tokenizes:
        out.append("the chat template was asked for but not applied")
    if w["ignore_eos"] and got.get("ignore_eos") is False:
        out.append("output lengths not forced (ignore_eos)")
    return "; ".join(out)


def kv_capacity_concurrency() -> int:
    """The concurrency at which the publishers said the decode's KV ran out."""
    return int(reference()["workload"]["decode_kv_capacity"]["concurrency"])


def kv_capacity_text() -> str:
    """The publishers' own statement of where the decode's KV ran out."""
    k = reference()["workload"]["decode_kv_capacity"]
    return f"published: {k['concurrency']:,} ('{k['quote']}', {k['source']})"


def ratios(config: dict[str, Any], points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per concurrency, measured or published (sorted): the measured figure (per
    working GPU, summary.json's point keys), the published one, their ratio, the range of
    the ratio within the reading precision, and a note where there is no ratio."""
    err = reference()["precision"]["tokens_per_s_per_gpu_abs"]
    pub = {p["concurrency"]: p for p in config["points"]}
    meas: dict[int, dict] = {}
    for p in points:
        c = p.get("max_concurrency")
        if isinstance(c, int) and not isinstance(c, bool):
            meas[c] = p
    rows = []
    for c in sorted(set(pub) | set(meas)):
        m, q = meas.get(c), pub.get(c)
        y = m.get(MEASURE) if m and m.get("status") == "ok" else None
        y = y if isinstance(y, (int, float)) and not isinstance(y, bool) else None
        row: dict[str, Any] = {
            "configuration": config["name"], "concurrency": c,
            "measured": y, "measured_per_allocated_gpu":
                (m or {}).get("total_tokens_per_s_per_allocated_gpu") if y is not None else None,
            "measured_tokens_per_s_per_user": (m or {}).get("tokens_per_s_per_user")
                if y is not None else None,
            "published": q["total_tokens_per_s_per_gpu"] if q else None,
            "published_tokens_per_s_per_user": q["tokens_per_s_per_user"] if q else None,
            "approximate": bool(q and q.get("approximate")),
            "ratio": None, "ratio_low": None, "ratio_high": None, "note": ""}
        if q is None:
            row["note"] = (f"no published point at c={c} for {config['name']} (published: "
                           + ", ".join(str(k) for k in sorted(pub)) + "); not interpolated")
        elif m is None:
            row["note"] = "not measured in this run"
        elif y is None:
            row["note"] = f"this run's point failed: {m.get('failure_reason') or 'not ok'}"
        else:
            v = q["total_tokens_per_s_per_gpu"]
            row["ratio"] = y / v
            row["ratio_low"] = y / (v + err)
            row["ratio_high"] = y / (v - err) if v > err else None
            if q.get("approximate"):
                row["note"] = "published point hard to read (marked ~)"
        rows.append(row)
    return rows


def series(config: dict[str, Any]) -> list[tuple[float, float, int]]:
    """(tok/s per user, total tok/s per working GPU, concurrency) of one configuration."""
    return [(float(p["tokens_per_s_per_user"]), float(p["total_tokens_per_s_per_gpu"]),
             int(p["concurrency"])) for p in config["points"]]
