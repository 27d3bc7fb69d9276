"""GSM8K accuracy gate through the router, scored by a named harness.

    python -m launcher.clients.accuracy --base-url http://router:8000 --model NAME \\
        --test test.jsonl --train train.jsonl [--harness lm-eval|vllm] [--repeat N] \\
        [--num-questions N] [--num-shots 5] [--fewshot-seed 1234] \\
        [--metric strict-match|flexible-extract] [--chat multiturn] [--max-tokens 256] \\
        [--concurrency 64] [--retries 2] [--request-timeout S] [--threshold 0.88] \\
        --output run/accuracy/gsm8k.json

Two harnesses, each with its own prompts, requests and scoring (docs/gsm8k.md):

- `lm-eval` (the default): lm-evaluation-harness 0.4.13's `gsm8k`, launcher/clients/gsm8k.py.
  With --train, the run is what `lm_eval --tasks gsm8k` with local-completions (or
  local-chat-completions with --chat) and `--limit N` does. Without it the examples come
  from the test file, as lm-eval does when the few-shot split is the test split, and the
  result says it is not comparable.
- `vllm`: vLLM's own GSM8K harness (tests/evals/gsm8k/gsm8k_eval.py), the one the published
  figure comes from, launcher/clients/gsm8k_vllm.py: the first rows of --train as examples
  for every question, the last integer of the output. --repeat N runs it N times; the
  result has each run, the mean (what the threshold checks) and the spread.

This file sends the requests. A request that still fails after its retries is never scored
as a wrong answer: the gate stops, writes the file with `status: failed`, the reason and
`passed: false`, and exits 1.
Exit status: 0 the evaluation ran (pass or fail is `passed`), 1 requests failed, 2 unusable
inputs (one sentence says what to fix).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.clients import gsm8k, gsm8k_vllm

LM_EVAL, VLLM = "lm-eval", gsm8k_vllm.HARNESS
HARNESSES = (LM_EVAL, VLLM)
DEFAULT_RETRIES = 2  # after the first attempt: 3 attempts, lm-eval's max_retries=3
DEFAULT_TIMEOUT = 300.0  # lm-eval's API models' per-request timeout (vllm: 600 s, its own)


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


def _vllm_equivalent(a: argparse.Namespace, n: int) -> str:
    """vLLM's own command line for the same requests (docs/gsm8k.md)."""
    host, _, port = a.base_url.rstrip("/").rpartition(":")
    if not port.isdigit():
        host, port = a.base_url.rstrip("/"), "80"
    return (f"python tests/evals/gsm8k/gsm8k_eval.py --host {host} --port {port} "
            f"--num-questions {n} --num-shots {a.num_shots} --max-tokens {a.max_tokens} "
            f"--seed {gsm8k_vllm.SEED} --max-concurrency {a.concurrency} "
            f"--request-timeout-seconds {a.request_timeout:g}, run {a.repeat} time"
            f"{'s' if a.repeat > 1 else ''} (vLLM's script downloads GSM8K itself: the "
            "same rows as the train and test files given here)")


def _check(a: argparse.Namespace) -> None:
    """Raise gsm8k.DataError for settings no run can use."""
    for bad, what in ((a.concurrency < 1, "--concurrency must be 1 or more."),
                      (a.retries < 0, "--retries must be 0 or more."),
                      (a.max_tokens < 1, "--max-tokens must be 1 or more."),
                      (a.request_timeout <= 0, "--request-timeout must be positive."),
                      (a.num_questions is not None and a.num_questions < 1,
                       "--num-questions must be 1 or more."),
                      (not 0.0 <= a.threshold <= 1.0, "--threshold must be between 0 and 1."),
                      (a.repeat < 1, "--repeat must be 1 or more."),
                      (a.harness == LM_EVAL and a.repeat != 1,
                       "--repeat is for --harness vllm (the published runs repeat vLLM's "
                       "harness); lm-eval's gsm8k runs once."),
                      (a.harness == VLLM and a.chat is not None,
                       "--chat is lm-eval's; the vllm harness sends plain prompts to "
                       "/v1/completions."),
                      (a.harness == VLLM and not a.train,
                       "the vllm harness takes its examples from the first rows of the train "
                       "split; give --train.")):
        if bad:
            raise gsm8k.DataError(what)


def _requests(a: argparse.Namespace, docs: list[gsm8k.Doc], test: list[gsm8k.Doc],
              train: list[gsm8k.Doc] | None
              ) -> tuple[list[list[gsm8k.Doc]], list[gsm8k.Doc], list[dict[str, Any]], str]:
    """(each question's examples, the pool they come from, the bodies, the endpoint)."""
    if a.harness == VLLM:
        assert train is not None  # _check
        for d in docs:  # vLLM's harness refuses (asserts) a gold answer without an integer
            gsm8k_vllm.label(d["answer"])
        examples = gsm8k_vllm.fewshot(train, a.num_shots)
        bodies = [gsm8k_vllm.request_body(gsm8k_vllm.render_prompt(d, examples),
                                          max_tokens=a.max_tokens) for d in docs]
        return [examples] * len(docs), train, bodies, gsm8k_vllm.ENDPOINT
    pool = train if train is not None else test
    shots = gsm8k.sample_fewshot(docs, pool, a.num_shots, seed=a.fewshot_seed,
                                 pool_is_eval_split=train is None)
    if a.chat:
        prompts: list[Any] = [gsm8k.render_messages(d, s, multiturn=a.chat == "multiturn")
                              for d, s in zip(docs, shots, strict=True)]
    else:
        prompts = [gsm8k.render_prompt(d, s) for d, s in zip(docs, shots, strict=True)]
    bodies = [gsm8k.request_body(a.model, p, max_tokens=a.max_tokens) for p in prompts]
    return shots, pool, bodies, "/v1/chat/completions" if a.chat else "/v1/completions"


def _record(a: argparse.Namespace, i: int, run: int, d: gsm8k.Doc, shots: list[int],
            ans: dict[str, Any] | None) -> dict[str, Any]:
    """One question's record: index, run, question, gold, shots (rows of the pool), then the
    output, the extracted answer and the verdict of the harness."""
    gold = gsm8k_vllm.label(d["answer"]) if a.harness == VLLM else gsm8k.reference(d["answer"])
    rec: dict[str, Any] = {"index": i, "run": run, "question": d["question"],
                           "reference": gold, "shots": shots}
    if ans is None:
        rec.update(output=None, error="not answered: the gate stopped on a failed request")
    elif a.harness == VLLM:
        sc = gsm8k_vllm.score(ans["output"], d["answer"])
        rec.update(extracted=sc["extracted"], invalid=sc["invalid"], correct=sc["correct"],
                   **ans, error=None)
    else:
        sc = gsm8k.score(ans["output"], d["answer"])
        rec.update(extracted=sc[a.metric]["extracted"], correct=sc[a.metric]["correct"],
                   strict_match=sc[gsm8k.STRICT]["extracted"],
                   flexible_extract=sc[gsm8k.FLEXIBLE]["extracted"], **ans, error=None)
    return rec


def evaluate(a: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Run the gate in-process: (the result object, the exit status). Raises
    gsm8k.DataError for unusable inputs."""
    a.harness = getattr(a, "harness", LM_EVAL)
    a.repeat = getattr(a, "repeat", 1)
    if getattr(a, "request_timeout", None) is None:
        a.request_timeout = gsm8k_vllm.REQUEST_TIMEOUT if a.harness == VLLM else DEFAULT_TIMEOUT
    _check(a)
    test = gsm8k.load_jsonl(a.test)
    train = gsm8k.load_jsonl(a.train) if a.train else None
    docs = test[: a.num_questions] if a.num_questions else test
    shots, pool, bodies, endpoint = _requests(a, docs, test, train)
    position = {id(d): i for i, d in enumerate(pool)}  # shots are the pool's own rows
    shot_rows = [[position[id(x)] for x in s] for s in shots]

    runs: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    totals: dict[str, int] = {}
    failure = None
    lm_eval_figures: dict[str, Any] = {}
    for run in range(1, a.repeat + 1):
        if a.progress and a.repeat > 1:
            print(f"run {run}/{a.repeat}", flush=True)
        t0 = time.perf_counter()
        answers, counts = asyncio.run(ask_all(
            a.base_url.rstrip("/") + endpoint, bodies, chat=bool(a.chat),
            concurrency=a.concurrency, retries=a.retries, request_timeout=a.request_timeout,
            progress=a.progress))
        latency = time.perf_counter() - t0
        failure = counts.pop("failure")
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
        records += [_record(a, i, run, d, shot_rows[i], ans)
                    for i, (d, ans) in enumerate(zip(docs, answers, strict=True))]
        tokens = sum(r["output_tokens"] for r in answers if r)
        fig: dict[str, Any] = {"run": run, "status": "ok" if failure is None else "failed"}
        if failure is None:
            outputs = [r["output"] for r in answers if r]
            if a.harness == VLLM:
                s = gsm8k_vllm.summarize(docs, outputs)
                fig.update(accuracy=s["accuracy"], invalid_rate=s["invalid_rate"],
                           correct=s["correct"], invalid=s["invalid"])
            else:
                lm_eval_figures = gsm8k.summarize(docs, outputs, num_shots=a.num_shots,
                                                  metric=a.metric, threshold=a.threshold)
                lm_eval_figures.pop("per_question")
                fig.update(accuracy=lm_eval_figures["accuracy"],
                           invalid_rate=lm_eval_figures["invalid_rate"])
        else:
            fig.update(accuracy=None, invalid_rate=None)
        fig.update(latency=latency, questions_per_second=counts["answered"] / latency
                   if latency else 0.0, total_output_tokens=tokens,
                   tokens_per_second=tokens / latency if latency else 0.0, requests=counts)
        runs.append(fig)
        if failure is not None:
            break

    comparable = train is not None and a.harness == LM_EVAL
    res: dict[str, Any] = {"task": gsm8k.TASK, "harness": a.harness, "repeat": a.repeat}
    if failure is not None:
        where = (f"question {failure['question_index']} failed after "
                 f"{failure['attempts']} attempts" if failure["question_index"] is not None
                 else "the client failed")
        if a.repeat > 1:
            where = f"run {len(runs)} of {a.repeat}: {where}"
        res.update(metric=a.metric if a.harness == LM_EVAL else None, accuracy=None,
                   invalid_rate=None, threshold=a.threshold, passed=False,
                   num_questions=len(docs), num_shots=a.num_shots, scores=None,
                   status="failed",
                   failure_reason=f"{where} ({failure['reason']}); "
                                  f"{runs[-1]['requests']['answered']}/{len(docs)} answered, "
                                  "no accuracy")
    elif a.harness == VLLM:
        acc = gsm8k_vllm.spread([r["accuracy"] for r in runs])
        inv = gsm8k_vllm.spread([r["invalid_rate"] for r in runs])
        res.update(metric=None, accuracy=acc["mean"], invalid_rate=inv["mean"],
                   threshold=a.threshold, passed=acc["mean"] >= a.threshold,
                   num_questions=len(docs), num_shots=a.num_shots, scores=None,
                   spread={"accuracy": acc, "invalid_rate": inv},
                   status="ok", failure_reason=None)
    else:  # lm-eval runs once (_check)
        res.update(lm_eval_figures, status="ok", failure_reason=None)
    if a.harness == VLLM:
        res.update(fewshot_source="train", fewshot_seed=None, comparable_with_lm_eval=False,
                   comparability=_vllm_equivalent(a, len(docs)),
                   temperature=gsm8k_vllm.TEMPERATURE, seed=gsm8k_vllm.SEED,
                   stop=list(gsm8k_vllm.STOP))
    else:
        res.update(fewshot_source="train" if comparable else "test",
                   fewshot_seed=a.fewshot_seed, comparable_with_lm_eval=comparable,
                   comparability=(_lm_eval_equivalent(a, len(docs)) if comparable else
                                  "NOT comparable with lm-eval's gsm8k: the few-shot examples "
                                  "came from the test file (lm-eval's gsm8k draws them from "
                                  "the train split); give --train"),
                   temperature=0.0, seed=gsm8k.REQUEST_SEED, stop=list(gsm8k.STOP))
    latency = sum(r["latency"] for r in runs)
    out_tokens = sum(r["total_output_tokens"] for r in runs)
    res.update(
        chat=a.chat, endpoint=endpoint, model=a.model, base_url=a.base_url,
        test=str(a.test), train=str(a.train) if a.train else None,
        max_tokens=a.max_tokens, concurrency=a.concurrency, retries=a.retries,
        request_timeout=a.request_timeout, requests=totals,
        num_errors=totals["failed"], first_error=failure["reason"] if failure else None,
        latency=latency, questions_per_second=totals["answered"] / latency if latency else 0.0,
        total_output_tokens=out_tokens,
        tokens_per_second=out_tokens / latency if latency else 0.0,
        timestamp=time.time(), runs=runs, records=records)
    return res, 0 if failure is None else 1


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m launcher.clients.accuracy",
                                 description="GSM8K accuracy gate, scored by a named harness: "
                                             "lm-eval's gsm8k or vLLM's own GSM8K harness.")
    ap.add_argument("--base-url", required=True, help="the router (P/D is what gets tested)")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--test", required=True, help="GSM8K test jsonl (the questions, in order)")
    ap.add_argument("--train", default=None,
                    help="GSM8K train jsonl (the few-shot pool); without it the examples "
                         "come from --test and the score is not comparable with lm-eval "
                         "(the vllm harness needs it)")
    ap.add_argument("--output", required=True, type=Path)
    ap.add_argument("--harness", choices=HARNESSES, default=LM_EVAL,
                    help="lm-eval: lm-evaluation-harness's gsm8k; vllm: vLLM's "
                         "tests/evals/gsm8k/gsm8k_eval.py (the published figure's)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the vllm harness N times: each run, the mean and the spread")
    ap.add_argument("--num-questions", type=int, default=None,
                    help="ask the first N (lm-eval's --limit N); default: all")
    ap.add_argument("--num-shots", type=int, default=gsm8k.NUM_SHOTS)
    ap.add_argument("--fewshot-seed", type=int, default=gsm8k.FEWSHOT_SEED,
                    help="lm-eval's few-shot sampling seed (the vllm harness does not sample)")
    ap.add_argument("--metric", choices=gsm8k.METRICS, default=gsm8k.STRICT,
                    help="lm-eval's figure the threshold applies to (both are reported); "
                         "the vllm harness has one figure")
    ap.add_argument("--chat", choices=("multiturn", "singleturn"), default=None,
                    help="send chat messages to /v1/chat/completions as lm-eval's "
                         "--apply_chat_template does (multiturn: its default)")
    ap.add_argument("--max-tokens", type=int, default=gsm8k.MAX_TOKENS)
    ap.add_argument("--concurrency", type=int, default=64,
                    help="requests in flight (lm-eval's num_concurrent, its default is 1; "
                         "vLLM's harness: at most 100, aiohttp's connection limit)")
    ap.add_argument("--retries", type=int, default=DEFAULT_RETRIES,
                    help="retries after a failed attempt (2 = lm-eval's max_retries=3)")
    ap.add_argument("--request-timeout", type=float, default=None,
                    help=f"seconds per request (default: the harness's own, lm-eval "
                         f"{DEFAULT_TIMEOUT:g}, vllm {gsm8k_vllm.REQUEST_TIMEOUT:g})")
    ap.add_argument("--threshold", type=float, default=0.88)
    ap.add_argument("--quiet", dest="progress", action="store_false",
                    help="no progress lines")
    return ap


def result_line(res: dict[str, Any]) -> str:
    """The figure the gate printed, naming its harness."""
    verdict = f"(threshold {res['threshold']:g}): {'passed' if res['passed'] else 'FAILED'}"
    if res.get("harness") == VLLM:
        acc, inv = res["spread"]["accuracy"], res["spread"]["invalid_rate"]
        runs = (f" (mean of {res['repeat']} runs: min {acc['min']:.3f}, max "
                f"{acc['max']:.3f}, stdev {acc['stdev']:.3f})" if res["repeat"] > 1 else "")
        return (f"GSM8K {res['num_shots']}-shot, vllm harness: accuracy {acc['mean']:.3f}"
                f"{runs} on {res['num_questions']} questions {verdict}; invalid "
                f"{inv['mean']:.3f}, {res['latency']:.1f} s")
    other = gsm8k.FLEXIBLE if res["metric"] == gsm8k.STRICT else gsm8k.STRICT
    return (f"GSM8K {res['num_shots']}-shot {res['metric']}, lm-eval harness: accuracy "
            f"{res['accuracy']:.3f} ({other} {res['scores'][other]['accuracy']:.3f}) on "
            f"{res['num_questions']} questions {verdict}; invalid {res['invalid_rate']:.3f}, "
            f"{res['latency']:.1f} s")


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
    from launcher.run.rundir import write_json

    write_json(a.output, res)
    if status == 0:
        if a.progress and a.repeat > 1:
            for r in res["runs"]:
                print(f"run {r['run']}: accuracy {r['accuracy']:.3f}, invalid "
                      f"{r['invalid_rate']:.3f}, {r['latency']:.1f} s")
        print(f"{result_line(res)} -> {a.output}")
        if a.harness == LM_EVAL and not res["comparable_with_lm_eval"]:
            print(f"note: {res['comparability']}")
    else:
        print(f"error: GSM8K gate failed: {res['failure_reason']} -> {a.output}",
              file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
