"""GSM8K accuracy gate through the router (the check that caught the async-scheduling races).

    python -m launcher.accuracy --base-url http://router:8000 --model NAME --data test.jsonl \
        [--train train.jsonl] [--num-questions N] [--num-shots 5] [--max-tokens 256] \
        [--concurrency 64] [--threshold 0.88] --output run/accuracy/gsm8k.json

Prompts and sampling follow vLLM's `tests/evals/gsm8k/gsm8k_eval.py` (notes §6): k-shot
"Question: ...\\nAnswer: <worked answer>\\n\\n" blocks, then "Question: ...\\nAnswer:";
temperature 0, seed 42, stop ["Question", "Assistant:", "<|separator|>"], /v1/completions.

Scoring is lm-eval's gsm8k "strict-match": the first "#### <number>" in the output, compared
case-insensitively after dropping ",", "$" and a trailing "." (the reference is the text after
the final "####"). When an output has no "####", the "The answer is <number>" rule of
lm-eval's gsm8k-cot strict-match is tried; unlike lm-eval's pattern (whose final "." is a
regex wildcard) it does not need a character after the number. No match is "[invalid]".

Data: local jsonl files in GSM8K format, {"question", "answer"} with the answer ending
"#### N" (the cluster may have no internet). Few-shot examples come from `--train` (its first
k rows, as vLLM does) or, without it, from the first k rows of `--data`, which are then not
asked as questions.

The exit status is 0 when the evaluation ran (pass or fail is `passed` in the file), 1 when
no request got an answer, 2 when the inputs are unusable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

STOP = ["Question", "Assistant:", "<|separator|>"]
INVALID = "[invalid]"
SEED = 42
# lm-eval gsm8k strict-match; the cot variant's rule is the fallback (module docstring).
STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
ANSWER_IS_RE = re.compile(r"The answer is (\-?[0-9\.\,]+)")


class AccuracyError(Exception):
    """The evaluation cannot run with these inputs; the message names what to fix."""


def normalize(text: str) -> str:
    """lm-eval's exact_match preparation for gsm8k, in its order: drop ",", "$", everything up
    to the last "#### ", one trailing "."; then ignore case (and surrounding blanks)."""
    s = text.replace(",", "").replace("$", "")
    s = re.sub(r"(?s).*#### ", "", s)
    s = re.sub(r"\.$", "", s.strip())
    return s.strip().lower()


def extract_answer(output: str) -> str:
    """The model's answer by strict-match, or "[invalid]"."""
    for pattern in (STRICT_RE, ANSWER_IS_RE):
        found = pattern.findall(output)
        if found:
            return found[0].strip()
    return INVALID


def reference_answer(answer: str) -> str:
    """The number after the final "####" of a GSM8K answer, normalized."""
    if "####" not in answer:
        raise AccuracyError("a GSM8K answer does not end with '#### N'; check the --data file.")
    return normalize(answer.split("####")[-1])


def is_correct(output: str, answer: str) -> tuple[str, bool]:
    extracted = extract_answer(output)
    if extracted == INVALID:
        return extracted, False
    return extracted, normalize(extracted) == reference_answer(answer)


def load_jsonl(path: str | Path) -> list[dict[str, str]]:
    p = Path(path)
    if not p.is_file():
        raise AccuracyError(f"GSM8K data file {p} does not exist; set the recipe's "
                            "accuracy data path to a local jsonl file.")
    rows = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise AccuracyError(f"{p} line {n} is not JSON; the file must be GSM8K "
                                    "jsonl.") from None
            if not isinstance(row, dict) or "question" not in row or "answer" not in row:
                raise AccuracyError(f"{p} line {n} lacks 'question' or 'answer'.")
            rows.append(row)
    return rows


def few_shot_prefix(shots: list[dict[str, str]]) -> str:
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


def prepare(data: list[dict[str, str]], train: list[dict[str, str]] | None, num_shots: int,
            num_questions: int | None) -> tuple[list[dict[str, str]], list[dict[str, str]], str]:
    """(shots, questions, where the shots came from)."""
    if num_shots < 0:
        raise AccuracyError("--num-shots must be 0 or more.")
    if train is not None:
        if len(train) < num_shots:
            raise AccuracyError(f"the --train file has {len(train)} rows, fewer than "
                                f"--num-shots {num_shots}.")
        shots, questions, source = train[:num_shots], data, "train"
    else:
        shots, questions = data[:num_shots], data[num_shots:]
        source = f"first {num_shots} rows of the data file (not asked)"
    if num_questions is not None:
        questions = questions[:num_questions]
    if not questions:
        raise AccuracyError("no questions are left to ask; give a larger --data file or "
                            "fewer --num-shots.")
    for q in questions:
        reference_answer(q["answer"])  # every question must be scorable before we start
    return shots, questions, source


async def _ask(session: Any, url: str, body: dict[str, Any]) -> tuple[str, int, str]:
    """(text, completion tokens, error)."""
    import aiohttp

    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                return "", 0, f"HTTP {resp.status}: {(await resp.text())[:200]}"
            data = await resp.json(content_type=None)
            text = data["choices"][0].get("text") or ""
            tokens = (data.get("usage") or {}).get("completion_tokens") or 0
            return text, int(tokens), ""
    except (aiohttp.ClientError, OSError, ValueError, KeyError, IndexError, TypeError,
            TimeoutError) as e:
        return "", 0, f"{type(e).__name__}: {e}"[:300]


async def evaluate_async(
    base_url: str, model: str, shots: list[dict[str, str]], questions: list[dict[str, str]],
    *, max_tokens: int = 256, concurrency: int = 64, temperature: float = 0.0,
    request_timeout: float = 600.0, progress: bool = False,
) -> tuple[list[dict[str, Any]], float]:
    import aiohttp

    url = base_url.rstrip("/") + "/v1/completions"
    prefix = few_shot_prefix(shots)
    sem = asyncio.Semaphore(max(1, concurrency))
    records: list[dict[str, Any]] = [{} for _ in questions]
    done = [0]
    every = max(1, len(questions) // 10)  # a progress line per ~10% for the log

    async def one(i: int, session: aiohttp.ClientSession) -> None:
        q = questions[i]
        body = {"model": model, "prompt": f"{prefix}Question: {q['question']}\nAnswer:",
                "max_tokens": max_tokens, "temperature": temperature, "stop": STOP,
                "seed": SEED}
        async with sem:
            t0 = time.perf_counter()
            text, tokens, error = await _ask(session, url, body)
            latency = time.perf_counter() - t0
        extracted, correct = is_correct(text, q["answer"])
        records[i] = {"index": i, "question": q["question"],
                      "reference": reference_answer(q["answer"]), "extracted": extracted,
                      "correct": correct, "output": text, "output_tokens": tokens,
                      "latency": latency, "error": error or None}
        done[0] += 1
        if progress and (done[0] % every == 0 or done[0] == len(questions)):
            print(f"answered {done[0]}/{len(questions)}", flush=True)

    timeout = aiohttp.ClientTimeout(total=request_timeout)
    connector = aiohttp.TCPConnector(limit=max(1, concurrency))
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(one(i, session) for i in range(len(questions))))
    return records, time.perf_counter() - t0


def run_gsm8k(
    base_url: str, model: str, data: str | Path, *, train: str | Path | None = None,
    num_questions: int | None = None, num_shots: int = 5, max_tokens: int = 256,
    concurrency: int = 64, threshold: float = 0.88, request_timeout: float = 600.0,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the gate in-process and return the result object (the CLI writes it)."""
    rows = load_jsonl(data)
    train_rows = load_jsonl(train) if train else None
    shots, questions, source = prepare(rows, train_rows, num_shots, num_questions)
    records, latency = asyncio.run(evaluate_async(
        base_url, model, shots, questions, max_tokens=max_tokens, concurrency=concurrency,
        request_timeout=request_timeout, progress=progress))
    n = len(records)
    correct = sum(r["correct"] for r in records)
    invalid = sum(r["extracted"] == INVALID for r in records)
    errors = [r["error"] for r in records if r["error"]]
    out_tokens = sum(r["output_tokens"] for r in records)
    accuracy = correct / n
    return {
        "task": "gsm8k",
        "extraction": "strict-match",
        "accuracy": accuracy,
        "invalid_rate": invalid / n,
        "num_questions": n,
        "num_shots": len(shots),
        "max_tokens": max_tokens,
        "threshold": threshold,
        "passed": accuracy >= threshold,
        "latency": latency,
        "questions_per_second": n / latency if latency > 0 else 0.0,
        "total_output_tokens": out_tokens,
        "tokens_per_second": out_tokens / latency if latency > 0 else 0.0,
        "num_errors": len(errors),
        "first_error": errors[0] if errors else None,
        "timestamp": time.time(),
        "model": model,
        "base_url": base_url,
        "data": str(data),
        "fewshot_source": str(train) if train else source,
        "temperature": 0.0,
        "seed": SEED,
        "stop": STOP,
        "records": records,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.accuracy",
                                 description="GSM8K strict-match accuracy gate.")
    ap.add_argument("--base-url", required=True, help="the router (P/D is what gets tested)")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--data", required=True, help="GSM8K-format jsonl (questions)")
    ap.add_argument("--train", default=None, help="jsonl for the few-shot examples")
    ap.add_argument("--num-questions", type=int, default=None, help="default: all")
    ap.add_argument("--num-shots", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--threshold", type=float, default=0.88)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--output", required=True, type=Path)
    a = ap.parse_args(argv)
    try:
        res = run_gsm8k(a.base_url, a.model, a.data, train=a.train,
                        num_questions=a.num_questions, num_shots=a.num_shots,
                        max_tokens=a.max_tokens, concurrency=a.concurrency,
                        threshold=a.threshold, request_timeout=a.request_timeout,
                        progress=True)
    except AccuracyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from launcher.run.rundir import write_json

    write_json(a.output, res)
    verdict = "passed" if res["passed"] else "FAILED"
    print(f"GSM8K {res['num_shots']}-shot strict-match: accuracy {res['accuracy']:.3f} "
          f"on {res['num_questions']} questions (threshold {res['threshold']}): {verdict}; "
          f"invalid {res['invalid_rate']:.3f}, {res['latency']:.1f} s -> {a.output}")
    if res["num_errors"] == res["num_questions"]:
        print(f"error: no request to {a.base_url} got an answer "
              f"(first error: {res['first_error']}).", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
