"""GSM8K exactly as vLLM's own harness runs it (vLLM's tests/evals/gsm8k/gsm8k_eval.py).

The harness the published "GSM8K 88 %" comes from (srt-slurm's `gsm8k` benchmark runs a copy
of it, `repeat: 5`). Its rules differ from lm-eval's `gsm8k` (launcher/clients/gsm8k.py) in
every step after the prompt: the few-shot examples are the first rows of the train split for
every question, the stop list is another, and the score is the last integer of the output
against the last integer of the gold answer, with "invalid" where there is none.

Pure and stdlib-only, like gsm8k.py. Every rule here is a fact of vLLM's file, with its
source, in docs/gsm8k.md ("vLLM's own GSM8K harness"); tests/test_gsm8k_harness.py holds
this module to values read off that file, including the outputs on which the two harnesses
disagree.
"""

from __future__ import annotations

import re
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from launcher.clients.gsm8k import DataError, Doc

HARNESS = "vllm"
NUM_SHOTS = 5  # --num-shots default
SEED = 42  # --seed default, sent in every request body
MAX_TOKENS = 256  # --max-tokens default
TEMPERATURE = 0.0  # what main() sends on /v1/completions when --temperature is not given
STOP = ("Question", "Assistant:", "<|separator|>")  # the same list for every request
REQUEST_TIMEOUT = 600.0  # the aiohttp session's total timeout, per request
# With no --max-concurrency the harness sends every question at once through an aiohttp
# session with the default connector, which opens at most this many connections.
AIOHTTP_CONNECTION_LIMIT = 100
ENDPOINT = "/v1/completions"

_DIGIT_RUN = re.compile(r"\d+")  # Unicode decimal digits, as the harness's pattern matches


def fewshot(pool: Sequence[Doc], num_shots: int = NUM_SHOTS) -> list[Doc]:
    """The examples of every question: the first `num_shots` rows of the train file, in file
    order (no sampling, no seed)."""
    if num_shots < 0:
        raise DataError("the number of shots must be 0 or more.")
    if num_shots > len(pool):
        raise DataError(f"{num_shots} shots need {num_shots} train rows but the train file "
                        f"has {len(pool)}; give a larger train file or fewer shots.")
    return list(pool[:num_shots])


def render_prompt(doc: Doc, shots: Sequence[Doc]) -> str:
    """The /v1/completions prompt: per example "Question: q\\nAnswer: a\\n\\n" (the whole
    worked answer, "#### N" included), then "Question: q\\nAnswer:" with no space after it."""
    examples = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    return f"{examples}Question: {doc['question']}\nAnswer:"


def request_body(prompt: str, *, max_tokens: int = MAX_TOKENS, seed: int = SEED,
                 temperature: float = TEMPERATURE) -> dict[str, Any]:
    """The JSON body the harness posts to /v1/completions, keys in its order. No "model":
    the server (and vllm-router) use the one model they serve."""
    return {"prompt": prompt, "max_tokens": max_tokens, "stop": list(STOP),
            "temperature": temperature, "seed": seed}


def _integer(run: str) -> int | None:
    """A run of decimal digits read as a Python integer literal, None where Python's
    literal rules refuse it: a non-ASCII digit, a leading zero before a non-zero digit
    ("05"), or more digits than int's string-conversion limit (4300 by default)."""
    if not run.isascii():
        return None
    if not run.strip("0"):
        return 0  # "0", "00", "000...": a valid literal whatever its length
    if run[0] == "0":
        return None
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()  # 0: no limit (old Pythons)
    if limit and len(run) > limit:
        return None
    return int(run)


def extract(output: Any) -> int | None:
    """The harness's answer: drop every ",", take the LAST run of digits, read it as an
    integer. None (the harness's INVALID) when there is no digit or the run is not a valid
    literal. No sign and no decimals: "-3" is 3, "12.5" is 5, "3.50" is 50, "18.00" is 0."""
    runs = _DIGIT_RUN.findall(output.replace(",", "") if isinstance(output, str) else "")
    return _integer(runs[-1]) if runs else None


def label(answer: str) -> int:
    """The gold value: the same extraction applied to the whole worked gold answer."""
    value = extract(answer)
    if value is None:
        raise DataError(f"a gold answer has no integer the vllm harness can read: "
                        f"{answer[-60:]!r}")
    return value


def score(output: Any, answer: str) -> dict[str, Any]:
    """{"extracted": int or None, "invalid": bool, "correct": bool} for one output."""
    value = extract(output)
    return {"extracted": value, "invalid": value is None,
            "correct": value is not None and value == label(answer)}


def summarize(docs: Sequence[Doc], outputs: Sequence[Any]) -> dict[str, Any]:
    """One run's figures: `accuracy` (share of correct answers) and `invalid_rate` (share
    with no readable integer), over every question."""
    if len(docs) != len(outputs) or not docs:
        raise DataError("summarize needs one output per question, and at least one question.")
    scored = [score(o, d["answer"]) for d, o in zip(docs, outputs, strict=True)]
    n = len(docs)
    correct = sum(s["correct"] for s in scored)
    invalid = sum(s["invalid"] for s in scored)
    return {"accuracy": correct / n, "invalid_rate": invalid / n, "correct": correct,
            "invalid": invalid, "num_questions": n, "per_question": scored}


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, min, max and sample standard deviation (None for a single run) of a figure
    over repeated runs."""
    if not values:
        raise DataError("no runs to aggregate.")
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None}
