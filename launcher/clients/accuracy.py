"""GSM8K accuracy gate through the router, scored as lm-evaluation-harness 0.4.13's `gsm8k`.

    python -m launcher.clients.accuracy --base-url http://router:8000 --model NAME \\
        --test test.jsonl --train train.jsonl [--num-questions N] [--num-shots 5] \\
        [--fewshot-seed 1234] [--metric strict-match|flexible-extract] [--chat multiturn] \\
        [--max-tokens 256] [--concurrency 64] [--retries 2] [--threshold 0.88] \\
        --output run/accuracy/gsm8k.json

Prompts, sampling and scoring are launcher/clients/gsm8k.py (lm-eval's semantics, see
docs/gsm8k.md); this file sends the requests. With --train, the run is what
`lm_eval --tasks gsm8k` with local-completions (or local-chat-completions with --chat) and
`--limit N` does. Without it the examples come from the test file, as lm-eval does when the
few-shot split is the test split, and the result says it is not comparable.

A request that still fails after its retries is never scored as a wrong answer: the gate
stops, writes the file with `status: failed`, the reason and `passed: false`, and exits 1.
Exit status: 0 the evaluation ran (pass or fail is `passed`), 1 requests failed, 2 unusable
inputs (one sentence says what to fix).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.clients import gsm8k

DEFAULT_RETRIES = 2  # after the first attempt: 3 attempts, lm-eval's max_retries=3
DEFAULT_TIMEOUT = 300.0  # lm-eval's API models' per-request timeout


def backoff(attempt: int) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based): lm-eval's tenacity
    wait_exponential(multiplier=0.5, min=1, max=10), i.e. 1, 1, 2, 4, 8, 10, 10..."""
    return min(max(0.5 * 2 ** (attempt - 1), 1.0), 10.0)


class RequestFailed(Exception):
    def __init__(self, index: int, attempts: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.attempts, self.reason = index, attempts, reason


async def _post_once(session: Any, url: str, body: dict[str, Any], chat: bool
                     ) -> tuple[str, int]:
    """(output text, completion tokens); raises ValueError with the reason otherwise."""
    async with session.post(url, json=body) as resp:
        raw = await resp.text()
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}: {raw[:200]}")
    data = json.loads(raw)
    choice = data["choices"][0]
    out = choice["message"]["content"] if chat else choice["text"]
    tokens = (data.get("usage") or {}).get("completion_tokens") or 0
    # a null text is an answer, not a failure: lm-eval scores it as "" (its placeholder)
    return (out if isinstance(out, str) else ""), int(tokens)


async def ask_all(url: str, bodies: list[dict[str, Any]], *, chat: bool = False,
                  concurrency: int = 64, retries: int = DEFAULT_RETRIES,
                  request_timeout: float = DEFAULT_TIMEOUT, wait: Callable[[int], float] = backoff,
                  progress: bool = False) -> tuple[list[dict[str, Any] | None], dict[str, Any]]:
    """Send every body, at most `concurrency` in flight, each tried 1 + `retries` times.

    Returns (one result per body: {"output", "output_tokens", "latency", "attempts"} or None
    when it was never answered, and request counts with the failure, if any). The first
    request that fails for good cancels the rest: the gate has failed, and a half-answered
    run has no accuracy.
    """
    import aiohttp

    sem = asyncio.Semaphore(max(1, concurrency))
    results: list[dict[str, Any] | None] = [None] * len(bodies)
    counts = {"http_attempts": 0, "retried": 0}
    done = [0]
    every = max(1, len(bodies) // 10)

    async def one(i: int, session: aiohttp.ClientSession) -> None:
        reason = ""
        for attempt in range(1, retries + 2):
            async with sem:  # held only while a request is in flight, as lm-eval does
                counts["http_attempts"] += 1
                t0 = time.perf_counter()
                try:
                    out, tokens = await _post_once(session, url, bodies[i], chat)
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError,
                        IndexError, TypeError) as e:
                    reason = f"{type(e).__name__}: {e}"[:300]
                else:
                    results[i] = {"output": out, "output_tokens": tokens,
                                  "latency": time.perf_counter() - t0, "attempts": attempt}
                    done[0] += 1
                    if progress and (done[0] % every == 0 or done[0] == len(bodies)):
                        print(f"answered {done[0]}/{len(bodies)}", flush=True)
                    return
            if attempt <= retries:
                counts["retried"] += 1
                await asyncio.sleep(wait(attempt))
        raise RequestFailed(i, retries + 1, reason)

    failure = None
    connector = aiohttp.TCPConnector(limit=max(1, concurrency))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=request_timeout),
                                     connector=connector) as session:
        tasks = [asyncio.create_task(one(i, session)) for i in range(len(bodies))]
        pending: set[asyncio.Task] = set(tasks)
        while pending and failure is None:
            finished, pending = await asyncio.wait(pending,
                                                   return_when=asyncio.FIRST_EXCEPTION)
            for t in finished:
                if t.exception() is not None and failure is None:
                    failure = t.exception()
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    fail = None
    if failure is not None:
        if isinstance(failure, RequestFailed):
            fail = {"question_index": failure.index, "attempts": failure.attempts,
                    "reason": failure.reason}
        else:  # a bug, not a server problem: still a failed gate with its reason
            fail = {"question_index": None, "attempts": None,
                    "reason": f"{type(failure).__name__}: {failure}"[:300]}
    counts.update(questions=len(bodies), answered=sum(r is not None for r in results),
                  failed=0 if fail is None else 1, failure=fail)
    return results, counts


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def _lm_eval_equivalent(a: argparse.Namespace, n: int) -> str:
    model = "local-chat-completions" if a.chat else "local-completions"
    path = "/v1/chat/completions" if a.chat else "/v1/completions"
    args = (f"model={a.model},base_url={a.base_url.rstrip('/')}{path},"
            f"num_concurrent={a.concurrency},max_retries={a.retries + 1},"
            f"max_gen_toks={a.max_tokens},timeout={int(a.request_timeout)}")
    args += ",tokenizer_backend=none" if not a.chat else ""
    cmd = (f"lm_eval --model {model} --model_args {args} --tasks gsm8k "
           f"--num_fewshot {a.num_shots} --seed 0,1234,1234,{a.fewshot_seed} --limit {n}")
    if a.chat:
        cmd += " --apply_chat_template" + (" --fewshot_as_multiturn false"
                                           if a.chat == "singleturn" else "")
    return cmd + (" --include_path TASKDIR (a config that points gsm8k at the same train "
                  "and test files: docs/gsm8k.md)")


def evaluate(a: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Run the gate in-process: (the result object, the exit status). Raises
    gsm8k.DataError for unusable inputs."""
    for bad, what in ((a.concurrency < 1, "--concurrency must be 1 or more."),
                      (a.retries < 0, "--retries must be 0 or more."),
                      (a.max_tokens < 1, "--max-tokens must be 1 or more."),
                      (a.request_timeout <= 0, "--request-timeout must be positive."),
                      (a.num_questions is not None and a.num_questions < 1,
                       "--num-questions must be 1 or more."),
                      (not 0.0 <= a.threshold <= 1.0, "--threshold must be between 0 and 1.")):
        if bad:
            raise gsm8k.DataError(what)
    test = gsm8k.load_jsonl(a.test)
    train = gsm8k.load_jsonl(a.train) if a.train else None
    docs = test[: a.num_questions] if a.num_questions else test
    pool = train if train is not None else test
    shots = gsm8k.sample_fewshot(docs, pool, a.num_shots, seed=a.fewshot_seed,
                                 pool_is_eval_split=train is None)
    if a.chat:
        prompts: list[Any] = [gsm8k.render_messages(d, s, multiturn=a.chat == "multiturn")
                              for d, s in zip(docs, shots, strict=True)]
    else:
        prompts = [gsm8k.render_prompt(d, s) for d, s in zip(docs, shots, strict=True)]
    bodies = [gsm8k.request_body(a.model, p, max_tokens=a.max_tokens) for p in prompts]
    endpoint = "/v1/chat/completions" if a.chat else "/v1/completions"

    t0 = time.perf_counter()
    answers, counts = asyncio.run(ask_all(
        a.base_url.rstrip("/") + endpoint, bodies, chat=bool(a.chat),
        concurrency=a.concurrency, retries=a.retries, request_timeout=a.request_timeout,
        progress=a.progress))
    latency = time.perf_counter() - t0
    failure = counts.pop("failure")

    position = {id(d): i for i, d in enumerate(pool)}  # the sampler returns pool's own rows
    records = []
    for i, (d, s, ans) in enumerate(zip(docs, shots, answers, strict=True)):
        rec: dict[str, Any] = {"index": i, "question": d["question"],
                               "reference": gsm8k.reference(d["answer"]),
                               "shots": [position[id(x)] for x in s]}
        if ans is None:
            rec.update(output=None, error="not answered: the gate stopped on a failed request")
        else:
            sc = gsm8k.score(ans["output"], d["answer"])
            rec.update(extracted=sc[a.metric]["extracted"], correct=sc[a.metric]["correct"],
                       strict_match=sc[gsm8k.STRICT]["extracted"],
                       flexible_extract=sc[gsm8k.FLEXIBLE]["extracted"], **ans, error=None)
        records.append(rec)

    comparable = train is not None
    res: dict[str, Any] = {"task": gsm8k.TASK}
    if failure is None:
        fig = gsm8k.summarize(docs, [r["output"] for r in answers], num_shots=a.num_shots,
                              metric=a.metric, threshold=a.threshold)
        fig.pop("per_question")
        res.update(fig, status="ok", failure_reason=None)
    else:
        where = (f"question {failure['question_index']} failed after "
                 f"{failure['attempts']} attempts" if failure["question_index"] is not None
                 else "the client failed")
        res.update(metric=a.metric, accuracy=None, invalid_rate=None, threshold=a.threshold,
                   passed=False, num_questions=len(docs), num_shots=a.num_shots, scores=None,
                   status="failed",
                   failure_reason=f"{where} ({failure['reason']}); "
                                  f"{counts['answered']}/{len(docs)} answered, no accuracy")
    out_tokens = sum(r["output_tokens"] for r in answers if r)
    res.update(
        chat=a.chat, endpoint=endpoint, model=a.model, base_url=a.base_url,
        test=str(a.test), train=str(a.train) if a.train else None,
        fewshot_source="train" if comparable else "test",
        fewshot_seed=a.fewshot_seed, comparable_with_lm_eval=comparable,
        comparability=(_lm_eval_equivalent(a, len(docs)) if comparable else
                       "NOT comparable with lm-eval's gsm8k: the few-shot examples came from "
                       "the test file (lm-eval's gsm8k draws them from the train split); "
                       "give --train"),
        max_tokens=a.max_tokens, temperature=0.0, seed=gsm8k.REQUEST_SEED,
        stop=list(gsm8k.STOP), concurrency=a.concurrency, retries=a.retries,
        request_timeout=a.request_timeout, requests=counts,
        num_errors=counts["failed"], first_error=failure["reason"] if failure else None,
        latency=latency, questions_per_second=counts["answered"] / latency if latency else 0.0,
        total_output_tokens=out_tokens,
        tokens_per_second=out_tokens / latency if latency else 0.0,
        timestamp=time.time(), records=records)
    return res, 0 if failure is None else 1


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m launcher.clients.accuracy",
                                 description="GSM8K accuracy gate, scored as lm-eval's gsm8k.")
    ap.add_argument("--base-url", required=True, help="the router (P/D is what gets tested)")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--test", required=True, help="GSM8K test jsonl (the questions, in order)")
    ap.add_argument("--train", default=None,
                    help="GSM8K train jsonl (the few-shot pool); without it the examples "
                         "come from --test and the score is not comparable with lm-eval")
    ap.add_argument("--output", required=True, type=Path)
    ap.add_argument("--num-questions", type=int, default=None,
                    help="ask the first N (lm-eval's --limit N); default: all")
    ap.add_argument("--num-shots", type=int, default=gsm8k.NUM_SHOTS)
    ap.add_argument("--fewshot-seed", type=int, default=gsm8k.FEWSHOT_SEED)
    ap.add_argument("--metric", choices=gsm8k.METRICS, default=gsm8k.STRICT,
                    help="the figure the threshold applies to (both are reported)")
    ap.add_argument("--chat", choices=("multiturn", "singleturn"), default=None,
                    help="send chat messages to /v1/chat/completions as lm-eval's "
                         "--apply_chat_template does (multiturn: its default)")
    ap.add_argument("--max-tokens", type=int, default=gsm8k.MAX_TOKENS)
    ap.add_argument("--concurrency", type=int, default=64,
                    help="requests in flight (lm-eval's num_concurrent; its default is 1)")
    ap.add_argument("--retries", type=int, default=DEFAULT_RETRIES,
                    help="retries after a failed attempt (2 = lm-eval's max_retries=3)")
    ap.add_argument("--request-timeout", type=float, default=DEFAULT_TIMEOUT)
    ap.add_argument("--threshold", type=float, default=0.88)
    ap.add_argument("--quiet", dest="progress", action="store_false",
                    help="no progress lines")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        a.output.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(a.output.parent, os.W_OK):
            raise OSError
    except OSError:
        print(f"error: cannot write --output {a.output}; give a writable path.", file=sys.stderr)
        return 2
    try:
        res, status = evaluate(a)
    except gsm8k.DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _write_json(a.output, res)
    if status == 0:
        other = gsm8k.FLEXIBLE if a.metric == gsm8k.STRICT else gsm8k.STRICT
        print(f"GSM8K {res['num_shots']}-shot {res['metric']}: accuracy {res['accuracy']:.3f} "
              f"({other} {res['scores'][other]['accuracy']:.3f}) on {res['num_questions']} "
              f"questions (threshold {res['threshold']:g}): "
              f"{'passed' if res['passed'] else 'FAILED'}; invalid {res['invalid_rate']:.3f}, "
              f"{res['latency']:.1f} s -> {a.output}")
        if not res["comparable_with_lm_eval"]:
            print(f"note: {res['comparability']}")
    else:
        print(f"error: GSM8K gate failed: {res['failure_reason']} -> {a.output}",
              file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
