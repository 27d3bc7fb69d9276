"""A tiny multi-turn session trace in AIPerf's mooncake_trace format and a word-level
tokenizer for AIPerf to build its prompts with, both made here (no hub, no network); and
readers of what AIPerf and the engines recorded of a run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

WORDS = 1000
AIPERF = Path(os.environ.get("PD_AIPERF", "/var/tmp/pd-aiperf/venv/bin/aiperf"))
INSTALL = "bash tests/aiperf/setup.sh"


def aiperf_or_fail(aiperf: Path = AIPERF) -> str:
    """The aiperf the tests drive; a missing one fails the test (never a skip that passes CI
    without running it)."""
    import pytest

    probe = subprocess.run([str(aiperf), "--version"], capture_output=True, text=True,
                           check=False) if aiperf.exists() else None
    if probe is None or probe.returncode != 0:
        pytest.fail(f"aiperf 0.13.0 is not installed at {aiperf}: run `{INSTALL}` (as root; "
                    "PD_AIPERF may name another environment's aiperf)")
    return str(aiperf)


def agentic_recipe(tmp: Path, trace: Path, aiperf: Path = AIPERF, decodes: int = 1,
                   block: int = 16, **agentic) -> Path:
    """Two prefills and `decodes` decodes on simulated engines (KV blocks of `block`
    tokens, the decodes logging each request), the agentic benchmark at 2 and 3 live
    sessions with the tokenizer in tmp/tok."""
    import yaml

    data = {
        "name": "agentic-sim", "cluster": "local", "engine": "sim", "mode": "disagg",
        "model": {"path": "sim/toy", "served_name": "toy"},
        "vllm_args": {"block-size": block},
        "prefill": {"endpoints": 2},
        "decode": {"endpoints": decodes, "args": {"enable-log-requests": True}},
        "benchmark": {"concurrency": [2, 3], "agentic": {
            "trace": str(trace), "trace_format": "mooncake_trace", "block_size": 64,
            "tokenizer": str(tmp / "tok"), "aiperf": str(aiperf), "drain_poll_s": 0.3,
            **agentic}},
        "accuracy": {"enabled": False},
    }
    path = tmp / "agentic.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def write_tokenizer(folder: Path) -> Path:
    """A Hugging Face fast tokenizer (WordLevel over w0..w996, whitespace-split) that
    transformers' AutoTokenizer loads from `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(WORDS - 3)]
    special = [{"id": i, "content": w, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i, w in enumerate(words[:3])]
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)},
                  "unk_token": "<unk>"}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
        "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 1 << 20}))
    return folder


def write_trace(path: Path, sessions: int, turns: int, input_len: int = 256,
                output_len: int = 8, block: int = 64, delay_ms: int = 50) -> Path:
    """`sessions` sessions of `turns` turns each; every turn brings `input_len` new tokens
    (AIPerf sends the session's history before them), its own hash ids."""
    lines = []
    blocks = -(-input_len // block)
    for s in range(sessions):
        for t in range(turns):
            first = (s * turns + t) * blocks
            row = {"session_id": f"s{s}", "input_length": input_len,
                   "output_length": output_len, "hash_ids": list(range(first, first + blocks))}
            if t:
                row["delay"] = delay_ms
            lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def conversations_by_engine(run: Path, role: str) -> dict[str, set[str]]:
    """The engines' own per-request lines (the sim's, with --enable-log-requests): for each
    conversation (the sha256 of its first user message, which every turn resends), the
    engines of `role` that served a turn of it."""
    seen: dict[str, set[str]] = {}
    for log in (run / "logs").glob(f"{role}-*.log"):
        engine = log.name.split("@")[0]
        for line in log.read_text().splitlines():
            if "] SIMULATED request " in line:
                conv = line.split(": conversation ", 1)[1].split(",", 1)[0]
                seen.setdefault(conv, set()).add(engine)
    return seen


def records(art: Path) -> list[dict]:
    """AIPerf's per-request records (profile_export.jsonl), profiling phase."""
    out = []
    for line in (art / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["metadata"].get("benchmark_phase", "profiling") == "profiling":
            out.append(rec)
    return out


def hit_bounds(recs: list[dict], block: int) -> tuple[int, int]:
    """The prefix-cache hits, in tokens, a prefill holding each session's KV must count for
    these requests: each later turn finds the previous turn's prompt, at least its whole
    blocks but the last two (vLLM hits whole blocks and recomputes the last token), at most
    all of it. A turn sent to a prefill without its session's KV would miss all of it."""
    seen: dict[str, list[tuple[int, int]]] = {}
    for rec in recs:
        meta = rec["metadata"]
        seen.setdefault(meta["x_correlation_id"], []).append(
            (meta["turn_index"], rec["metrics"]["usage_prompt_tokens"]["value"]))
    low = high = 0
    for turns in seen.values():
        prompts = [n for _, n in sorted(turns)]
        for prev in prompts[:-1]:
            low += (prev - 2 * block) // block * block
            high += prev
    return low, high
