"""A tiny multi-turn session trace in AIPerf's mooncake_trace format and a word-level
tokenizer for AIPerf to build its prompts with, both made here (no hub, no network); and
readers of what AIPerf and the engines recorded of a run."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = 1000


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
