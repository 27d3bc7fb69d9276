"""A tiny multi-turn session trace in AIPerf's mooncake_trace format and a word-level
tokenizer for AIPerf to build its prompts with, both made here (no hub, no network)."""

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
