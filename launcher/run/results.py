"""Reading sweep results: `bench/*.json` of either driver (`vllm bench serve` or the built-in
client), normalized. The one reader of bench/ for the orchestrator, the summary and the
dashboard; it imports nothing heavy.

Each point is the file's content plus `file` (its name) and, always present, `driver`
("builtin" | "vllm"), `status` ("ok" | "failed"), `failure_reason`, `window_start`,
`window_end` (unix seconds of the measured window; None when unknown). A real
`vllm bench serve` file gets its status derived here and its window from the sidecar
`<name>.window.json` the orchestrator writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from launcher.run.rundir import shape_problem

# Sidecar the orchestrator writes next to a real `vllm bench serve` file.
WINDOW_SUFFIX = ".window.json"
# The types the figures rely on in a result file (vLLM's schema; NaN is what vLLM writes
# for a statistic of no requests); a file with another type in one of them is damaged.
RESULT_TYPES = {
    "max_concurrency": "int | None", "num_prompts": "int | None", "completed": "int | None",
    "failed": "int | None", "total_input_tokens": "int | None",
    "total_output_tokens": "int | None", "duration": "real | None", "date": "str | None",
    "driver": "str | None", "status": "str | None", "failure_reason": "str | None",
    "window_start": "real | None", "window_end": "real | None", "errors": "list[str] | None",
    "ttfts": "list[real] | None", "latencies": "list[real] | None",
    "output_lens": "list[int] | None",
    **{f"{q}_{m}_ms": "real | None" for m in ("ttft", "tpot", "itl", "e2el")
       for q in ("mean", "median", "p50", "p90", "p99")},
}  # fmt: skip


def percentile(xs: list[float], p: float) -> float:
    """numpy.percentile's default (linear) method; 0 for an empty list, as vLLM reports."""
    if not xs:
        return 0.0
    s = sorted(xs)
    pos = (len(s) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def point_status(
    completed: Any, failed: Any, total_output_tokens: Any, num_prompts: Any, first_error: str = "",
) -> tuple[str, str | None]:
    """ok, or failed with the reason: any failed request, zero tokens, or too few completed."""
    completed = completed or 0
    failed = failed or 0
    reasons = []
    if failed:
        err = f" (first error: {first_error.splitlines()[0][:160]})" if first_error else ""
        reasons.append(f"{failed} request(s) failed{err}")
    if not total_output_tokens:
        reasons.append("zero output tokens generated")
    if num_prompts is not None and completed < num_prompts:
        reasons.append(f"completed {completed} of {num_prompts} requests")
    return ("failed", "; ".join(reasons)) if reasons else ("ok", None)


# --- reader --------------------------------------------------------------------------------


def _load_one(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        # --append-result writes newline-separated objects: the last complete one wins.
        obj = None
        for line in text.splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
    return obj if isinstance(obj, dict) else None


def _window_sidecar(path: Path) -> dict[str, Any]:
    for side in (path.with_name(path.stem + WINDOW_SUFFIX),
                 path.with_name(path.name + WINDOW_SUFFIX)):
        obj = _load_one(side)
        if obj:
            return obj
    return {}


def load_result(path: str | Path, problems: list | None = None) -> dict[str, Any] | None:
    """One result file of either driver, normalized (see `load_results`); None when the file
    is missing or is not a benchmark result, or is damaged: then (its name, why) goes to
    `problems` when given."""
    path = Path(path)
    res = _load_one(path)
    if res is None or "completed" not in res:
        return None
    why = shape_problem(res, RESULT_TYPES)
    if why:
        if problems is not None:
            problems.append((f"bench/{path.name}", f"bench/{path.name} is damaged ({why})"))
        return None
    res = dict(res)
    res["file"] = path.name
    res.setdefault("driver", "vllm")
    side = _window_sidecar(path)
    for k in ("window_start", "window_end"):
        if res.get(k) is None:
            res[k] = side.get(k)
    if res.get("status") not in ("ok", "failed"):
        errs = [e for e in res.get("errors") or [] if e]
        res["status"], res["failure_reason"] = point_status(
            res.get("completed"), res.get("failed"), res.get("total_output_tokens"),
            res.get("num_prompts"), first_error=errs[0] if errs else "")
    res.setdefault("failure_reason", None)
    return res


def point_failure(result_file: str | Path, exit_code: int | None = 0) -> str | None:
    """Why a sweep point failed, or None when it is ok: for the orchestrator, after the client
    (either driver) exited with `exit_code`."""
    damaged: list = []
    res = load_result(result_file, damaged)
    if damaged:
        return damaged[0][1]
    if res is None:
        return (f"no result file {Path(result_file).name} "
                f"(the client exited with status {exit_code}; see its log)")
    if res["status"] != "ok":
        return res["failure_reason"] or "failed"
    if exit_code:
        return f"the client exited with status {exit_code} after writing its result"
    return None


def load_results(run_dir: str | Path, problems: list | None = None) -> list[dict[str, Any]]:
    """Every sweep point in `<run_dir>/bench/`, from either driver, sorted by max_concurrency.

    Each dict is the file's content plus `file` (its name) and, always present, `driver`
    ("builtin" | "vllm"), `status`, `failure_reason`, `window_start`, `window_end` (None when
    unknown). A real `vllm bench serve` file gets its status derived (failed requests, zero
    output tokens, fewer completed than num_prompts) and its window from the sidecar
    `<name>.window.json`. A damaged file is left out, (its name, why) in `problems`."""
    bench = Path(run_dir) / "bench"
    points = []
    for path in sorted(bench.glob("*.json")):
        if path.name.endswith(WINDOW_SUFFIX) or path.name.endswith(".pytorch.json"):
            continue
        res = load_result(path, problems)
        if res is not None:
            points.append(res)

    def key(r: dict[str, Any]) -> tuple:
        c = r.get("max_concurrency")
        return (c is None, c if isinstance(c, (int, float)) else 0, str(r.get("date", "")),
                r["file"])

    return sorted(points, key=key)


