"""GSM8K gate (launcher/clients/gsm8k.py and launcher/clients/accuracy.py) without lm_eval:
sampling, prompts, filters, figures, and the HTTP client against a tiny local server.
tests/test_gsm8k_lmeval.py holds the same module to the real lm_eval package."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import completions_server

from launcher.clients import accuracy, gsm8k

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "gsm8k"
TRAIN, TEST = DATA / "train.jsonl", DATA / "test.jsonl"


def rows(n: int, tag: str = "q") -> list[dict[str, str]]:
    return [{"question": f"{tag}{i}?", "answer": f"w{i}\n#### {i}"} for i in range(n)]


# ---------------------------------------------------------------- data and sampling

def test_the_data_files_are_gsm8k_shaped() -> None:
    train, test = gsm8k.load_jsonl(TRAIN), gsm8k.load_jsonl(TEST)
    assert (len(train), len(test)) == (30, 10)
    assert not {d["question"] for d in train} & {d["question"] for d in test}
    for d in train + test:  # a worked answer scores as right under both filters
        assert all(v["correct"] for v in gsm8k.score(" " + d["answer"], d["answer"]).values())


@pytest.mark.parametrize(("text", "message"), [
    (None, "does not exist"),
    ('{"question": "q", "answer": "#### 1"}\nnot json\n', "line 2 is not JSON"),
    ('{"question": "q"}\n', "line 1 needs string fields"),
    ('{"question": "q", "answer": 7}\n', "line 1 needs string fields"),
    ('{"question": "q", "answer": "seven"}\n', "does not contain '#### N'"),
    ("\n\n", "has no rows"),
])
def test_unusable_files_say_what_to_fix(tmp_path: Path, text: str | None, message: str) -> None:
    p = tmp_path / "x.jsonl"
    if text is not None:
        p.write_text(text)
    with pytest.raises(gsm8k.DataError, match=re.escape(message)):
        gsm8k.load_jsonl(p)


def test_blank_lines_are_skipped_and_only_question_and_answer_are_kept(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('\n{"question": "q", "answer": "#### 1", "id": 3}\n\n')
    assert gsm8k.load_jsonl(p) == [{"question": "q", "answer": "#### 1"}]


def test_sampling_is_seeded_per_run_and_drawn_per_question_in_order() -> None:
    train, test = gsm8k.load_jsonl(TRAIN), gsm8k.load_jsonl(TEST)
    a = gsm8k.sample_fewshot(test, train, 5)
    assert a == gsm8k.sample_fewshot(test, train, 5, seed=1234)  # the default seed
    assert a != gsm8k.sample_fewshot(test, train, 5, seed=42)
    assert all(len(s) == 5 and len({x["question"] for x in s}) == 5 for s in a)
    assert len({tuple(x["question"] for x in s) for s in a}) == len(test)  # fresh per question
    # asking the first N draws exactly what the full run draws for them (lm-eval's --limit)
    assert gsm8k.sample_fewshot(test[:3], train, 5) == a[:3]
    # but question i's examples depend on the draws before it: not a per-question seed
    assert gsm8k.sample_fewshot(test[1:2], train, 5)[0] != a[1]
    # pinned: the first question's examples are these train rows (checked against lm_eval
    # in tests/test_gsm8k_lmeval.py)
    assert [train.index(x) for x in a[0]] == [24, 14, 3, 0, 2]
    assert gsm8k.sample_fewshot(test, train, 0) == [[] for _ in test]


def test_shots_from_the_eval_split_never_include_the_question() -> None:
    test = gsm8k.load_jsonl(TEST)
    for doc, shots in zip(test, gsm8k.sample_fewshot(test, test, 5, pool_is_eval_split=True),
                          strict=True):
        assert doc not in shots and len(shots) == 5
    # copies of the question in the pool are all dropped, and it still gets 5 examples
    pool = rows(6) + [rows(1)[0]] * 3
    for shots in gsm8k.sample_fewshot(pool[:1] * 20, pool, 5, pool_is_eval_split=True):
        assert pool[0] not in shots and len(shots) == 5


def test_too_small_a_pool_is_an_input_error() -> None:
    with pytest.raises(gsm8k.DataError, match="needs 5 few-shot rows but the pool has 4"):
        gsm8k.sample_fewshot(rows(2), rows(4), 5)
    with pytest.raises(gsm8k.DataError, match="needs 6 few-shot rows but the pool has 5"):
        gsm8k.sample_fewshot(rows(5), rows(5), 5, pool_is_eval_split=True)


# ---------------------------------------------------------------- prompts and bodies

def test_prompt_shape() -> None:
    doc, s1, s2 = {"question": "Q?", "answer": "#### 0"}, *rows(2)
    assert gsm8k.render_prompt(doc, [s1, s2]) == (
        "Question: q0?\nAnswer: w0\n#### 0\n\n"
        "Question: q1?\nAnswer: w1\n#### 1\n\n"
        "Question: Q?\nAnswer:")
    assert gsm8k.render_prompt(doc, []) == "Question: Q?\nAnswer:"  # no trailing space


def test_chat_messages() -> None:
    doc, s1, s2 = {"question": "Q?", "answer": "#### 0"}, *rows(2)
    assert gsm8k.render_messages(doc, [s1, s2]) == [
        {"role": "user", "content": "Question: q0?\nAnswer:"},
        {"role": "assistant", "content": "w0\n#### 0"},
        {"role": "user", "content": "Question: q1?\nAnswer:"},
        {"role": "assistant", "content": "w1\n#### 1"},
        {"role": "user", "content": "Question: Q?\nAnswer:"}]
    assert gsm8k.render_messages(doc, [s1, s2], multiturn=False) == [
        {"role": "user", "content": gsm8k.render_prompt(doc, [s1, s2])}]


def test_request_bodies() -> None:
    assert gsm8k.request_body("m", "P") == {
        "prompt": "P", "model": "m", "max_tokens": 256, "temperature": 0.0,
        "stop": ["Question:", "</s>", "<|im_end|>"], "seed": 1234}
    msgs = [{"role": "user", "content": "x"}]
    assert gsm8k.request_body("m", msgs, max_tokens=9)["messages"] == msgs


# ---------------------------------------------------------------- filters and exact_match

@pytest.mark.parametrize(("output", "strict", "flexible"), [
    (" 42 - 30 = 12 left.\n#### 12", "12", "12"),
    ("#### 1,250.", "1,250.", "1,250."),
    ("#### 7\nOn second thought\n#### 9", "7", "9"),  # strict takes the first, flexible the last
    ("####12", gsm8k.INVALID, "12"),  # strict needs "#### " with its space
    ("#### $18", gsm8k.INVALID, "$18"),  # no "$" in strict's pattern
    ("The answer is 18.", gsm8k.INVALID, "18."),  # no "The answer is" rule in gsm8k
    ("so -4 degrees", gsm8k.INVALID, "-4"),
    ("it is 5", gsm8k.INVALID, "5"),  # one digit: the second alternative
    ("a . b", gsm8k.INVALID, gsm8k.INVALID),
    ("a .. b", gsm8k.INVALID, ".."),  # two of [$0-9.,] are "number-like"
    ("#### 12\n\nQuestion: 99 apples", "12", "99"),  # no client-side cut at stop words
    ("", gsm8k.INVALID, gsm8k.INVALID),
    (None, gsm8k.INVALID, gsm8k.INVALID),  # a non-string counts as ""
])
def test_filters(output: Any, strict: str, flexible: str) -> None:
    assert gsm8k.strict_match(output) == strict
    assert gsm8k.flexible_extract(output) == flexible


@pytest.mark.parametrize(("extracted", "answer", "correct"), [
    ("1,250.", "... #### 1250", True),
    ("$1,250", "#### 1250", True),
    ("-4", "#### -4", True),
    ("4", "#### -4", False),
    ("72.50", "#### 72.5", False),  # strings, not numbers
    ("3.0", "#### 3", False),
    ("12", "a\n#### 9\nb\n#### 12", True),  # the text after the last "#### "
    ("12.", "#### 12.", True),
    ("12..", "#### 12", False),  # only one final "." goes
    (gsm8k.INVALID, "#### 3", False),
])
def test_exact_match(extracted: str, answer: str, correct: bool) -> None:
    assert gsm8k.exact_match(extracted, answer) is correct


def test_summary_figures() -> None:
    docs = rows(4)
    outs = ["#### 0", "the answer is 1", "#### 5", ""]
    res = gsm8k.summarize(docs, outs, num_shots=5, threshold=0.5)
    s, f = res["scores"]["strict-match"], res["scores"]["flexible-extract"]
    assert (s["accuracy"], s["invalid"], f["accuracy"], f["invalid"]) == (0.25, 2, 0.5, 1)
    assert res["metric"] == "strict-match" and res["accuracy"] == 0.25
    assert res["passed"] is False and res["invalid_rate"] == 0.5
    assert res["num_questions"] == 4 and res["num_shots"] == 5
    assert s["stderr"] == pytest.approx(0.25)  # sqrt(p(1-p)*n/(n-1)/n): lm-eval's mean_stderr
    res = gsm8k.summarize(docs, outs, num_shots=5, metric="flexible-extract", threshold=0.5)
    assert res["accuracy"] == 0.5 and res["passed"] is True and res["invalid_rate"] == 0.25
    with pytest.raises(gsm8k.DataError, match="metric must be one of"):
        gsm8k.summarize(docs, outs, num_shots=5, metric="exact")


# ---------------------------------------------------------------- the HTTP client

@dataclass
class Server:
    """A stand-in /v1/completions and /v1/chat/completions on 127.0.0.1."""

    key: dict[str, str] = field(default_factory=dict)  # question -> GSM8K answer
    wrong: bool = False
    fail_first: int = 0  # every question's first n attempts get HTTP 500
    always: Callable[[], Any] | None = None  # a response for every request (status, body)
    null_text: bool = False
    delay: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0

    def reply(self, body: dict[str, Any]) -> tuple[int, Any]:
        if "messages" in body:
            last = body["messages"][-1]["content"]
        else:
            last = body["prompt"].rsplit("Question: ", 1)[-1]
        q = last.removeprefix("Question: ").removesuffix("\nAnswer:")
        self.attempts[q] = self.attempts.get(q, 0) + 1
        if self.always:
            return self.always()
        if self.attempts[q] <= self.fail_first:
            return 500, "overloaded"
        final = self.key.get(q, "#### 0").rsplit("#### ", 1)[-1].replace(",", "")
        if self.wrong:
            final = str(int(final) + 1)
        text = None if self.null_text else f" It is {final}.\n#### {final}"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}}
                  if "messages" in body else {"index": 0, "text": text})
        return 200, {"choices": [choice], "usage": {"completion_tokens": 7}}


@contextlib.contextmanager
def serve(srv: Server) -> Iterator[str]:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        srv.bodies.append(body)
        srv.in_flight += 1
        srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            await asyncio.sleep(srv.delay)
            status, out = srv.reply(body)
        finally:
            srv.in_flight -= 1
        if isinstance(out, str):
            return web.Response(status=status, text=out)
        return web.json_response(out, status=status)

    with completions_server(handle) as url:
        yield url


def key() -> dict[str, str]:
    return {d["question"]: d["answer"] for d in gsm8k.load_jsonl(TEST)}


def args(url: str, out: Path, *extra: str) -> list[str]:
    return ["--base-url", url, "--model", "toy", "--test", str(TEST), "--train", str(TRAIN),
            "--output", str(out), "--quiet", *extra]


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.clients.accuracy", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_retries_then_success_and_concurrency_is_bounded() -> None:
    srv = Server(key=key(), fail_first=2, delay=0.02)
    bodies = [gsm8k.request_body("m", gsm8k.render_prompt(d, []))
              for d in gsm8k.load_jsonl(TEST)]
    with serve(srv) as url:
        res, counts = asyncio.run(accuracy.ask_all(url + "/v1/completions", bodies,
                                                   concurrency=3, retries=2,
                                                   wait=lambda _: 0.0))
    assert counts == {"http_attempts": 30, "retried": 20, "questions": 10, "answered": 10,
                      "failed": 0, "failure": None}
    assert all(r is not None and r["attempts"] == 3 and "#### " in r["output"] for r in res)
    assert srv.max_in_flight <= 3


def test_a_request_that_keeps_failing_stops_the_gate() -> None:
    srv = Server(always=lambda: (503, "no backend"))
    bodies = [gsm8k.request_body("m", f"Question: {i}\nAnswer:") for i in range(200)]
    with serve(srv) as url:
        res, counts = asyncio.run(accuracy.ask_all(url + "/v1/completions", bodies,
                                                   concurrency=2, retries=1,
                                                   wait=lambda _: 0.05))
    f = counts["failure"]
    assert f["attempts"] == 2 and f["reason"].startswith("ValueError: HTTP 503: no backend")
    assert counts["failed"] == 1 and counts["answered"] == 0
    assert counts["http_attempts"] < 300  # the rest were cancelled, not all tried twice
    assert all(r is None for r in res)


@pytest.mark.parametrize("reply", [
    lambda: (200, "not json"),
    lambda: (200, {"choices": []}),
    lambda: (200, {"error": "x"}),
])
def test_malformed_answers_are_failures_not_wrong_answers(reply: Callable) -> None:
    bodies = [gsm8k.request_body("m", "Question: 1\nAnswer:")]
    with serve(Server(always=reply)) as url:
        _, counts = asyncio.run(accuracy.ask_all(url + "/v1/completions", bodies, retries=1,
                                                 wait=lambda _: 0.0))
    assert counts["failed"] == 1 and counts["http_attempts"] == 2


def test_backoff_is_lm_evals() -> None:
    assert [accuracy.backoff(i) for i in range(1, 8)] == [1, 1, 2, 4, 8, 10, 10]


# ---------------------------------------------------------------- the CLI

def test_cli_passes_and_writes_both_figures(tmp_path: Path) -> None:
    out = tmp_path / "acc" / "gsm8k.json"
    srv = Server(key=key())
    with serve(srv) as url:
        assert accuracy.main(args(url, out, "--num-questions", "6", "--concurrency", "4")) == 0
    res = json.loads(out.read_text())
    for k in ("task", "accuracy", "threshold", "passed", "num_questions", "num_shots",
              "invalid_rate", "records", "timestamp"):
        assert k in res
    assert res["status"] == "ok" and res["passed"] is True and res["accuracy"] == 1.0
    assert res["scores"]["strict-match"]["accuracy"] == 1.0
    assert res["scores"]["flexible-extract"]["accuracy"] == 1.0
    assert res["metric"] == "strict-match" and res["chat"] is None
    assert res["num_questions"] == 6 and res["num_shots"] == 5
    assert res["comparable_with_lm_eval"] is True and "--limit 6" in res["comparability"]
    assert res["requests"]["http_attempts"] == 6 and res["requests"]["failed"] == 0
    # what went over the wire is gsm8k.py's body, examples from the train file
    train, test = gsm8k.load_jsonl(TRAIN), gsm8k.load_jsonl(TEST)
    shots = gsm8k.sample_fewshot(test[:6], train, 5)
    sent = sorted(srv.bodies, key=lambda b: b["prompt"][-200:])
    want = sorted((gsm8k.request_body("toy", gsm8k.render_prompt(d, s))
                   for d, s in zip(test[:6], shots, strict=True)),
                  key=lambda b: b["prompt"][-200:])
    assert sent == want
    assert res["records"][0]["shots"] == [24, 14, 3, 0, 2]


def test_cli_fails_the_gate_but_exits_0_when_answers_are_wrong(tmp_path: Path) -> None:
    out = tmp_path / "gsm8k.json"
    with serve(Server(key=key(), wrong=True)) as url:
        p = run_cli(*args(url, out, "--metric", "flexible-extract"))
    assert p.returncode == 0, p.stderr
    assert "FAILED" in p.stdout and "accuracy 0.000" in p.stdout
    res = json.loads(out.read_text())
    assert res["passed"] is False and res["metric"] == "flexible-extract"
    assert res["invalid_rate"] == 0.0 and res["num_questions"] == 10


def test_cli_chat_sends_messages(tmp_path: Path) -> None:
    out = tmp_path / "gsm8k.json"
    srv = Server(key=key())
    with serve(srv) as url:
        assert accuracy.main(args(url, out, "--chat", "multiturn", "--num-questions", "2")) == 0
    assert all(len(b["messages"]) == 11 for b in srv.bodies)
    res = json.loads(out.read_text())
    assert res["chat"] == "multiturn" and res["endpoint"] == "/v1/chat/completions"
    assert res["accuracy"] == 1.0


def test_null_text_is_an_answer_scored_wrong(tmp_path: Path) -> None:
    out = tmp_path / "gsm8k.json"
    with serve(Server(key=key(), null_text=True)) as url:
        assert accuracy.main(args(url, out, "--num-questions", "2")) == 0
    res = json.loads(out.read_text())
    assert res["accuracy"] == 0.0 and res["invalid_rate"] == 1.0 and res["status"] == "ok"


def test_without_train_the_result_says_not_comparable(tmp_path: Path) -> None:
    out = tmp_path / "gsm8k.json"
    with serve(Server(key=key())) as url:
        a = args(url, out)
        i = a.index("--train")
        p = run_cli(*a[:i], *a[i + 2:])
    assert p.returncode == 0, p.stderr
    assert "NOT comparable" in p.stdout
    res = json.loads(out.read_text())
    assert res["comparable_with_lm_eval"] is False and res["fewshot_source"] == "test"
    assert all(i not in r["shots"] for i, r in enumerate(res["records"]))


def test_cli_exit_1_when_requests_fail_after_retries(tmp_path: Path) -> None:
    out = tmp_path / "gsm8k.json"
    p = run_cli(*args("http://127.0.0.1:9", out, "--retries", "0"))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "GSM8K gate failed" in p.stderr and "after 1 attempts" in p.stderr
    res = json.loads(out.read_text())
    assert res["passed"] is False and res["status"] == "failed"
    assert res["failure_reason"] and res["scores"] is None and res["num_errors"] == 1
    assert res["accuracy"] is None  # not scored: no figure stands for a run that failed


@pytest.mark.parametrize(("extra", "message"), [
    (("--test", "/nonexistent.jsonl"), "does not exist"),
    (("--num-shots", "31"), "pool has 30"),
    (("--concurrency", "0"), "--concurrency must be 1 or more"),
    (("--threshold", "88"), "--threshold must be between 0 and 1"),
    (("--retries", "-1"), "--retries must be 0 or more"),
    (("--metric", "exact"), "invalid choice"),
    (("--output", "/dev/null/gsm8k.json"), "cannot write --output"),
])
def test_cli_exit_2_for_unusable_inputs(tmp_path: Path, extra: tuple[str, ...],
                                        message: str) -> None:
    out = tmp_path / "gsm8k.json"
    p = run_cli(*args("http://127.0.0.1:9", out), *extra)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.startswith("error") or
                ": error:" in ln]) == 1
    assert not out.exists()
