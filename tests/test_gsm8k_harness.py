"""vLLM's own GSM8K harness (launcher/clients/gsm8k_vllm.py, `accuracy.harness: vllm`).

Its prompts, request bodies and scores against values read off vLLM's
tests/evals/gsm8k/gsm8k_eval.py (commit 03e09605, docs/gsm8k.md "vLLM's own GSM8K
harness"): the first 5 train rows as every question's examples, the prompt byte for byte,
the body key for key, the last integer of the output (invalid when none, or when Python would
not read it as an integer literal), accuracy and invalid rate, repeated runs. The outputs
include those lm-eval's strict-match / flexible-extract score otherwise; the table of them in
docs/gsm8k.md is checked row by row against both harnesses. vLLM is not installed here (its
file imports vllm), so every expected value is written by hand from that file.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import completions_server

from launcher.clients import accuracy, gsm8k, gsm8k_vllm
from launcher.errors import UserError
from launcher.run import figures
from launcher.schema import recipe, yaml_io

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "gsm8k"
TRAIN, TEST = DATA / "train.jsonl", DATA / "test.jsonl"
DOC = ROOT / "docs" / "gsm8k.md"


def final(doc: dict[str, str]) -> int:
    """The gold number of the sample data ("#### N", N an integer; question 3's is -145)."""
    return int(doc["answer"].rsplit("#### ", 1)[1].replace(",", ""))


# ---------------------------------------------------------------- examples and prompts

def test_examples_are_the_first_train_rows_for_every_question() -> None:
    train = gsm8k.load_jsonl(TRAIN)
    assert gsm8k_vllm.fewshot(train) == train[:5]  # train_data[i] for i in range(5)
    assert gsm8k_vllm.fewshot(train, 2) == train[:2]
    assert gsm8k_vllm.fewshot(train, 0) == []
    with pytest.raises(gsm8k.DataError, match="the train file has 30"):
        gsm8k_vllm.fewshot(train, 31)


def test_prompt_is_vllms_byte_for_byte() -> None:
    shots = [{"question": "Q1?", "answer": "w1\n#### 1"}, {"question": "Q2?", "answer": "#### 2"}]
    doc = {"question": "Q?", "answer": "#### 9"}
    assert gsm8k_vllm.render_prompt(doc, shots) == (
        "Question: Q1?\nAnswer: w1\n#### 1\n\nQuestion: Q2?\nAnswer: #### 2\n\n"
        "Question: Q?\nAnswer:")
    assert gsm8k_vllm.render_prompt(doc, []) == "Question: Q?\nAnswer:"


def test_every_question_gets_the_same_five_examples() -> None:
    train, test = gsm8k.load_jsonl(TRAIN), gsm8k.load_jsonl(TEST)
    shots = gsm8k_vllm.fewshot(train)
    prompts = [gsm8k_vllm.render_prompt(d, shots) for d in test]
    assert prompts[0].startswith(
        "Question: Lena buys 3 notebooks for $4 each and a pen for $2. How much does she "
        "spend?\nAnswer: The notebooks cost 3 * 4 = $<<3*4=12>>12.\n")
    heads = {p[: p.rindex("Question: ")] for p in prompts}
    assert len(heads) == 1  # one few-shot prefix for all questions
    head = heads.pop()
    assert head.count("Question: ") == 5 and head.endswith("\n\n")
    assert all(f"Question: {t['question']}\nAnswer: {t['answer']}\n\n" in head for t in train[:5])
    assert all(p == head + f"Question: {d['question']}\nAnswer:"
               for p, d in zip(prompts, test, strict=True))
    # the same byte format as lm-eval's plain prompt; only the examples differ
    assert prompts == [gsm8k.render_prompt(d, train[:5]) for d in test]
    lm_eval = [gsm8k.render_prompt(d, s) for d, s in
               zip(test, gsm8k.sample_fewshot(test, train, 5), strict=True)]
    assert all(a != b for a, b in zip(prompts, lm_eval, strict=True))


def test_request_body_is_vllms_key_for_key() -> None:
    body = gsm8k_vllm.request_body("P")
    assert json.dumps(body) == (
        '{"prompt": "P", "max_tokens": 256, "stop": ["Question", "Assistant:", '
        '"<|separator|>"], "temperature": 0.0, "seed": 42}')
    assert "model" not in body  # call_vllm_api sends none: the server's one model answers
    assert gsm8k_vllm.request_body("P", max_tokens=32)["max_tokens"] == 32
    # and not lm-eval's: another stop list, another seed, a model name
    lm = gsm8k.request_body("m", "P")
    assert (lm["stop"], lm["seed"], lm["model"]) == (["Question:", "</s>", "<|im_end|>"], 1234,
                                                      "m")


# ---------------------------------------------------------------- extraction and scores

# (output, what get_answer_value returns; None for its INVALID): drop ",", the last run of
# \d+, ast.literal_eval of it, SyntaxError -> INVALID.
EXTRACT: list[tuple[Any, int | None]] = [
    ("#### 42", 42),
    (" 6 * 7 = 42\n#### 42", 42),
    ("#### 42\nThat is 2 more than 40.", 40),  # the last number, not the one after ####
    ("#### 12 apples and 3 pears", 3),
    ("The answer is 1,234.", 1234),
    ("#### 1,250.", 1250),
    ("1,2,3", 123),  # every "," goes, wherever it is
    ("#### -3", 3),  # \d+ has no sign
    ("#### 3.50", 50),  # nor a decimal point: the digits after it
    ("#### 12.5", 5),
    ("#### 18.00", 0),  # "00" is a valid literal: 0
    ("#### 18.0", 0),
    ("#### 0", 0),
    ("It costs $18", 18),
    ("#### $18", 18),
    ("50%", 50),
    ("#### 007", None),  # a leading zero: literal_eval's SyntaxError
    ("#### 05", None),
    ("3.05", None),
    ("#### ٤٢", None),  # \d matches Arabic-Indic digits; literal_eval refuses them
    ("#### 42 (٤٢)", None),  # ... and they are the last run
    ("#### ４２", None),  # fullwidth digits likewise
    ("x²", None),  # "²" is not a decimal digit: no run at all
    ("I don't know.", None),
    ("", None),  # the harness's answer to a failed request
    (None, None),  # the gate's: a null text
    ("1" * 4300, int("1" * 4300)),
    ("1" * 4301, None),  # past int's 4,300-digit limit: literal_eval's SyntaxError
    ("0" * 5000, 0),
]


@pytest.mark.parametrize(("output", "value"), EXTRACT, ids=lambda x: repr(x)[:30])
def test_extraction_is_vllms(output: Any, value: int | None) -> None:
    assert gsm8k_vllm.extract(output) == value


def test_gold_is_the_last_integer_of_the_worked_answer() -> None:
    assert gsm8k_vllm.label("It sold 1,340 - 985 = <<1340-985=355>>355.\n#### 355") == 355
    assert gsm8k_vllm.label("#### 1,250") == 1250
    assert gsm8k_vllm.label("#### -3") == 3  # the gold loses its sign too
    assert gsm8k_vllm.label("#### 0.5") == 5
    with pytest.raises(gsm8k.DataError, match="no integer"):
        gsm8k_vllm.label("#### none")


def test_score_and_figures() -> None:
    docs = [{"question": f"q{i}", "answer": f"w\n#### {n}"} for i, n in enumerate((42, 5, 7, 18))]
    outputs = ["#### 42", "#### -5", "#### 007", "#### 18.00"]
    assert [gsm8k_vllm.score(o, d["answer"]) for o, d in zip(outputs, docs, strict=True)] == [
        {"extracted": 42, "invalid": False, "correct": True},
        {"extracted": 5, "invalid": False, "correct": True},
        {"extracted": None, "invalid": True, "correct": False},
        {"extracted": 0, "invalid": False, "correct": False},
    ]
    s = gsm8k_vllm.summarize(docs, outputs)
    assert (s["accuracy"], s["invalid_rate"], s["correct"], s["invalid"]) == (0.5, 0.25, 2, 1)
    # the same outputs as lm-eval's strict-match scores them
    assert gsm8k.summarize(docs, outputs, num_shots=5)["accuracy"] == 0.25
    with pytest.raises(gsm8k.DataError, match="one output per question"):
        gsm8k_vllm.summarize(docs, outputs[:2])


def test_spread_of_repeated_runs() -> None:
    s = gsm8k_vllm.spread([1.0, 0.75, 0.5])
    assert s == {"mean": 0.75, "min": 0.5, "max": 1.0, "stdev": pytest.approx(0.25)}
    assert gsm8k_vllm.spread([0.9]) == {"mean": 0.9, "min": 0.9, "max": 0.9, "stdev": None}


# ---------------------------------------------------------------- the table in docs/gsm8k.md

def _cell(text: str) -> tuple[str | None, bool]:
    """'`40.` ✗' -> ('40.', False); 'invalid ✗' -> (None, False)."""
    verdict = text.strip().endswith("✓")
    assert text.strip()[-1] in "✓✗", text
    m = re.fullmatch(r"`([^`]*)` [✓✗]", text.strip())
    return (m.group(1) if m else None), verdict


def table_rows() -> list[dict[str, Any]]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### Where the harnesses disagree"):]
    section = section[: section.index("\n### ", 5)]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `\""):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        output = json.loads(cells[0].strip("`"))
        rows.append({"output": output, "gold": f"#### {cells[1]}",
                     "strict": _cell(cells[2]), "flexible": _cell(cells[3]),
                     "vllm": _cell(cells[4]), "why": cells[5]})
    return rows


ROWS = table_rows()


def test_the_table_covers_the_cases_where_the_harnesses_disagree() -> None:
    outputs = [r["output"] for r in ROWS]
    for needle in ("#### 42\nThat", "1,234.", "-5", "3.50", "$18", "#### 007", "٤٢", ""):
        assert any(needle in o for o in outputs), needle
    differ = [r for r in ROWS if len({r["strict"][1], r["flexible"][1], r["vllm"][1]}) > 1]
    assert len(differ) >= 10 and len(ROWS) - len(differ) >= 4  # and some where they agree


@pytest.mark.parametrize("row", ROWS, ids=lambda r: repr(r["output"])[:30])
def test_each_row_of_the_table_is_what_both_harnesses_score(row: dict[str, Any]) -> None:
    lm = gsm8k.score(row["output"], row["gold"])
    assert (lm["strict-match"]["extracted"], lm["strict-match"]["correct"]) == row["strict"]
    assert (lm["flexible-extract"]["extracted"], lm["flexible-extract"]["correct"]) == \
        row["flexible"]
    v = gsm8k_vllm.score(row["output"], row["gold"])
    want, right = row["vllm"]
    assert v["extracted"] == (None if want is None else int(want))
    assert v["correct"] is right and v["invalid"] is (want is None)


# ---------------------------------------------------------------- the gate, over HTTP

# Model-style outputs per question (the gold number g): what vLLM's harness and lm-eval's
# strict-match say of each.
STYLES: list[tuple[Callable[[int], str], bool, bool, bool]] = [
    # (output, vllm correct, vllm invalid, strict-match correct)
    (lambda g: f" {g} in all.\n#### {g}", True, False, True),
    (lambda g: f"#### {g}\nThat is 2 more than {g - 2}.", False, False, True),
    (lambda g: f"The answer is {g:,}.", True, False, False),
    (lambda g: f"#### {abs(g)}", True, False, False),  # question 3: gold -145, said 145
    (lambda g: f"#### {g}.00", False, False, False),
    (lambda g: f"It costs ${g}", True, False, False),
    (lambda g: "I don't know.", False, True, False),
    (lambda g: f"#### 0{g}", False, True, False),
    (lambda g: f"#### {g} (٤٢)", False, True, True),
    (lambda g: f"#### {g}", True, False, True),
]


class Stand:
    """/v1/completions on 127.0.0.1: answers question i in the style `pick(i, run)`, where
    run counts the times that question was asked."""

    def __init__(self, pick: Callable[[int, int], Callable[[int], str] | None]) -> None:
        self.test = gsm8k.load_jsonl(TEST)
        self.index = {d["question"]: i for i, d in enumerate(self.test)}
        self.pick = pick
        self.bodies: list[dict[str, Any]] = []
        self.asked: dict[int, int] = {}
        self.paths: set[str] = set()

    def reply(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        self.bodies.append(body)
        self.paths.add(path)
        q = body["prompt"].rsplit("Question: ", 1)[1].removesuffix("\nAnswer:")
        i = self.index[q]
        self.asked[i] = run = self.asked.get(i, 0) + 1
        style = self.pick(i, run)
        if style is None:
            return 500, {"error": "down"}
        text = style(final(self.test[i]))
        return 200, {"choices": [{"index": 0, "text": text}], "usage": {"completion_tokens": 5}}


@contextlib.contextmanager
def serve(stand: Stand) -> Iterator[str]:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        status, out = stand.reply(request.path, await request.json())
        return web.json_response(out, status=status)

    with completions_server(handle) as url:
        yield url


def gate(url: str, out: Path, *extra: str) -> int:
    return accuracy.main(["--base-url", url, "--model", "toy", "--test", str(TEST),
                          "--train", str(TRAIN), "--output", str(out), "--quiet",
                          "--concurrency", "4", *extra])


def test_the_gate_sends_vllms_requests_and_scores_as_vllm_does(tmp_path: Path) -> None:
    stand = Stand(lambda i, run: STYLES[i][0])
    out = tmp_path / "gsm8k.json"
    with serve(stand) as url:
        assert gate(url, out, "--harness", "vllm") == 0
    res = json.loads(out.read_text())
    train, test = gsm8k.load_jsonl(TRAIN), gsm8k.load_jsonl(TEST)
    # what went over the wire: vLLM's body for every question, its 5 examples
    assert stand.paths == {"/v1/completions"}
    want = [gsm8k_vllm.request_body(gsm8k_vllm.render_prompt(d, train[:5])) for d in test]
    assert sorted(stand.bodies, key=json.dumps) == sorted(want, key=json.dumps)
    assert all(list(b) == ["prompt", "max_tokens", "stop", "temperature", "seed"]
               for b in stand.bodies)
    # vLLM's figures: 5 of 10 right, 3 invalid
    assert res["harness"] == "vllm" and res["status"] == "ok" and res["repeat"] == 1
    assert (res["accuracy"], res["invalid_rate"]) == (0.5, 0.3)
    assert [s[1] for s in STYLES].count(True) / 10 == res["accuracy"]
    assert res["passed"] is False and res["threshold"] == 0.88
    assert res["spread"]["accuracy"] == {"mean": 0.5, "min": 0.5, "max": 0.5, "stdev": None}
    assert res["metric"] is None and res["scores"] is None and res["comparable_with_lm_eval"] is False
    assert (res["seed"], res["temperature"], res["stop"]) == (42, 0.0, list(gsm8k_vllm.STOP))
    assert res["request_timeout"] == 600.0 and res["endpoint"] == "/v1/completions"
    assert res["comparability"].startswith(
        "python tests/evals/gsm8k/gsm8k_eval.py --host http://127.0.0.1 --port ")
    assert "--num-questions 10 --num-shots 5 --max-tokens 256 --seed 42" in res["comparability"]
    # every question's record: index, run, shots, output, extracted answer, verdict
    recs = res["records"]
    assert [r["index"] for r in recs] == list(range(10)) and {r["run"] for r in recs} == {1}
    assert all(r["shots"] == [0, 1, 2, 3, 4] for r in recs)
    for r, d, (style, right, invalid, _) in zip(recs, test, STYLES, strict=True):
        g = final(d)
        assert r["reference"] == abs(g) and r["output"] == style(g)  # no sign: -145 is 145
        assert (r["correct"], r["invalid"]) == (right, invalid)
        assert r["extracted"] == gsm8k_vllm.extract(style(g))
    assert recs[3]["extracted"] == 145 == -final(test[3]) and recs[4]["extracted"] == 0
    assert recs[6]["extracted"] is None


def test_the_same_outputs_scored_by_lm_eval_give_another_figure(tmp_path: Path) -> None:
    stand = Stand(lambda i, run: STYLES[i][0])
    out = tmp_path / "gsm8k.json"
    with serve(stand) as url:
        assert gate(url, out) == 0  # the default harness: lm-eval
    res = json.loads(out.read_text())
    assert res["harness"] == "lm-eval" and res["metric"] == "strict-match"
    assert res["accuracy"] == sum(s[3] for s in STYLES) / 10 == 0.4
    assert all(b["seed"] == 1234 and b["model"] == "toy" for b in stand.bodies)
    assert all(r["run"] == 1 and len(r["shots"]) == 5 for r in res["records"])


def test_repeat_reports_each_run_the_mean_and_the_spread(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    right, wrong, none = STYLES[0][0], STYLES[4][0], STYLES[6][0]

    def pick(i: int, run: int) -> Callable[[int], str]:
        if run == 1:
            return right  # 4/4
        if run == 2:
            return none if i == 0 else right  # 3/4, one invalid
        return wrong if i < 2 else right  # 2/4

    stand = Stand(pick)
    out = tmp_path / "gsm8k.json"
    with serve(stand) as url:
        assert gate(url, out, "--harness", "vllm", "--repeat", "3", "--num-questions", "4",
                    "--threshold", "0.7") == 0
    res = json.loads(out.read_text())
    assert [(r["run"], r["accuracy"], r["invalid_rate"]) for r in res["runs"]] == [
        (1, 1.0, 0.0), (2, 0.75, 0.25), (3, 0.5, 0.0)]
    assert res["accuracy"] == 0.75 and res["invalid_rate"] == pytest.approx(0.25 / 3)
    acc = res["spread"]["accuracy"]
    assert (acc["mean"], acc["min"], acc["max"]) == (0.75, 0.5, 1.0)
    assert acc["stdev"] == pytest.approx(0.25)
    assert res["passed"] is True and res["repeat"] == 3  # the mean against the threshold
    assert len(res["records"]) == 12 and [r["run"] for r in res["records"]] == [1] * 4 + [2] * 4 + [3] * 4
    assert res["records"][4]["invalid"] is True and res["records"][8]["extracted"] == 0
    assert res["requests"]["http_attempts"] == 12 and res["requests"]["answered"] == 12
    assert len(stand.bodies) == 12 and len({json.dumps(b) for b in stand.bodies}) == 4
    printed = capsys.readouterr().out
    assert "GSM8K 5-shot, vllm harness: accuracy 0.750 (mean of 3 runs: min 0.500, max " \
           "1.000, stdev 0.250) on 4 questions (threshold 0.7): passed" in printed


def test_a_run_that_fails_stops_the_gate_with_no_accuracy(tmp_path: Path) -> None:
    stand = Stand(lambda i, run: None if run == 2 else STYLES[0][0])
    out = tmp_path / "gsm8k.json"
    with serve(stand) as url:
        assert gate(url, out, "--harness", "vllm", "--repeat", "3", "--num-questions", "3",
                    "--retries", "0") == 1
    res = json.loads(out.read_text())
    assert res["status"] == "failed" and res["accuracy"] is None and res["passed"] is False
    assert res["failure_reason"].startswith("run 2 of 3: question ")
    assert [r["status"] for r in res["runs"]] == ["ok", "failed"]
    assert res["runs"][0]["accuracy"] == 1.0 and res["runs"][1]["accuracy"] is None


@pytest.mark.parametrize(("extra", "message"), [
    (("--harness", "vllm", "--chat", "multiturn"), "--chat is lm-eval's"),
    (("--repeat", "2"), "--repeat is for --harness vllm"),
    (("--harness", "vllm", "--repeat", "0"), "--repeat must be 1 or more"),
    (("--harness", "vllm", "--num-shots", "31"), "the train file has 30"),
    (("--harness", "exact"), "invalid choice"),
])
def test_unusable_settings_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                  extra: tuple[str, ...], message: str) -> None:
    out = tmp_path / "gsm8k.json"
    with pytest.raises(SystemExit) if "exact" in extra else contextlib.nullcontext():
        assert gate("http://127.0.0.1:9", out, *extra) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_the_vllm_harness_needs_train_and_integer_golds(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "gsm8k.json"
    assert accuracy.main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--test",
                          str(TEST), "--output", str(out), "--harness", "vllm"]) == 2
    assert "give --train" in capsys.readouterr().err
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"question": "q", "answer": "#### none"}\n')
    assert accuracy.main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--test",
                          str(bad), "--train", str(TRAIN), "--output", str(out),
                          "--harness", "vllm"]) == 2
    assert "no integer the vllm harness can read" in capsys.readouterr().err
    assert not out.exists()


# ---------------------------------------------------------------- recipe, plan, summary

LOCAL = "local-sim"


def test_recipe_harness_default_and_checks() -> None:
    r = recipe.load(LOCAL)
    assert (r.accuracy.harness, r.accuracy.repeat) == ("lm-eval", 1)
    r = recipe.load(LOCAL, ["accuracy.harness=vllm", "accuracy.repeat=5"])
    assert (r.accuracy.harness, r.accuracy.repeat) == ("vllm", 5)
    for sets, words in [
        (["accuracy.repeat=5"], "repeat is for harness vllm"),
        (["accuracy.harness=vllm", "accuracy.chat=true"], "chat is lm-eval's"),
        (["accuracy.harness=vllm", "accuracy.train=null"], "set accuracy.train"),
        (["accuracy.harness=vllm", "accuracy.repeat=0"], "accuracy.repeat"),
        (["accuracy.harness=lm_eval"], "accuracy.harness"),
    ]:
        with pytest.raises(UserError) as e:
            recipe.load(LOCAL, sets)
        assert words in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)
    # the resolved recipe reads back the same (recipe.yaml in the run directory)
    again = recipe.validate(yaml_io.yaml_module().safe_load(recipe.dump(r)), "recipe.yaml")
    assert again.accuracy == r.accuracy


def _prepared(tmp_path: Path, sets: list[str]):
    from launcher.control import prepare

    return prepare.prepare(recipe.load(LOCAL, sets), tmp_path)


def _accuracy_argv(p) -> list[str]:
    plan = json.loads((p.run.path / "plan.json").read_text())
    return next(x for x in plan["processes"] if x["kind"] == "accuracy")["argv"]


def test_the_plan_runs_the_harness_the_recipe_names(tmp_path: Path) -> None:
    from launcher import text

    default = _prepared(tmp_path / "a", [])
    argv = _accuracy_argv(default)
    assert "--harness" not in argv and "--repeat" not in argv  # the command line of before
    assert argv[argv.index("--metric") + 1] == "strict-match"
    assert "strict-match as lm-eval scores it" in text.plan_text(default)
    p = _prepared(tmp_path / "b", ["accuracy.harness=vllm", "accuracy.repeat=5",
                                   "accuracy.concurrency=100"])
    argv = _accuracy_argv(p)
    assert argv[argv.index("--harness") + 1] == "vllm"
    assert argv[argv.index("--repeat") + 1] == "5"
    assert argv[argv.index("--concurrency") + 1] == "100"
    assert "--metric" not in argv and "--chat" not in argv and "--train" in argv
    line = next(ln for ln in text.plan_text(p).splitlines() if ln.startswith("Accuracy gate"))
    assert line == ("Accuracy gate: gsm8k 5-shot as vLLM's own GSM8K harness scores it "
                    "(harness vllm: the first 5 train rows as examples, the last integer of "
                    "the output), all questions, 5 runs, pass at mean >= 0.7")
    argv = _accuracy_argv(_prepared(tmp_path / "c", ["accuracy.harness=vllm"]))
    assert "--repeat" not in argv


VLLM_RESULT = {
    "task": "gsm8k", "harness": "vllm", "repeat": 5, "accuracy": 0.8812, "invalid_rate": 0.002,
    "threshold": 0.88, "passed": True, "metric": None, "scores": None, "num_questions": 1319,
    "num_shots": 5, "chat": None, "status": "ok", "failure_reason": None,
    "spread": {"accuracy": {"mean": 0.8812, "min": 0.875, "max": 0.886, "stdev": 0.004},
               "invalid_rate": {"mean": 0.002, "min": 0.0, "max": 0.004, "stdev": 0.001}},
    "runs": [{"run": k, "accuracy": 0.88} for k in range(1, 6)], "timestamp": 2.0,
}
LM_EVAL_RESULT = {
    "task": "gsm8k", "harness": "lm-eval", "accuracy": 0.9, "threshold": 0.88, "passed": True,
    "metric": "strict-match", "num_questions": 1319, "num_shots": 5, "invalid_rate": 0.0,
    "scores": {"strict-match": {"accuracy": 0.9}, "flexible-extract": {"accuracy": 0.91}},
    "comparable_with_lm_eval": True, "chat": None, "timestamp": 1.0,
}


def test_the_published_figure_is_shown_beside_its_own_harness_only() -> None:
    line = figures.accuracy_line(VLLM_RESULT)
    assert line.startswith("GSM8K 5-shot, vllm harness, 0.881 (mean of 5 runs: min 0.875, "
                           "max 0.886, stdev 0.004; invalid 0.002), 1319 questions")
    assert line.endswith("; published 0.88 (the same harness, 5-shot, 1,319 questions, 5 runs)")
    line = figures.accuracy_line(LM_EVAL_RESULT)
    assert "strict-match 0.900 (flexible-extract 0.910), lm-eval harness" in line
    assert "published 0.88" not in line and line.count("0.88") == 1  # the threshold only
    assert line.endswith("no published figure for this harness (the published GSM8K figure "
                         "is the vllm harness's)")
    old = {k: v for k, v in LM_EVAL_RESULT.items() if k != "harness"}  # written before harnesses
    assert figures.accuracy_line(old) == line


def test_summary_and_report_name_the_harness(tmp_path: Path) -> None:
    from launcher import report
    from launcher.run.rundir import RunDir, RunRecord
    from launcher.run.vocab import State

    run = tmp_path / "run"
    (run / "accuracy").mkdir(parents=True)
    RunDir(run).write_record(RunRecord(state=State.SUCCEEDED, started=1.0, ended=2.0))
    failed = dict(VLLM_RESULT, accuracy=0.5, passed=False)
    (run / "accuracy" / "gsm8k.json").write_text(json.dumps(failed))
    s = figures.summary(run)
    assert s["accuracy"]["harness"] == "vllm" and s["accuracy"]["spread"] == failed["spread"]
    assert s["accuracy"]["repeat"] == 5 and len(s["accuracy"]["runs"]) == 5
    assert any(r.startswith("GSM8K (vllm harness) accuracy 0.500 is below the threshold")
               for r in s["verdict_reasons"])
    assert "vllm harness" in figures.summary_table(s)
    html = report.headline({"headline": {"total_tokens_per_s_per_gpu": 1.0},
                            "accuracy": VLLM_RESULT})
    assert "GSM8K, vllm harness (1319 questions)" in html and "published 0.88" in html
    html = report.headline({"headline": {"total_tokens_per_s_per_gpu": 1.0},
                            "accuracy": LM_EVAL_RESULT})
    assert "GSM8K, lm-eval harness (1319 questions)" in html and "published 0.88" not in html


def test_a_seed_switch_to_the_vllm_harness_validates() -> None:
    """What switching the seed recipe would be (not switched here: docs/gsm8k.md)."""
    r = recipe.load("qwen3.5-397b-gb200-disagg", ["accuracy.harness=vllm", "accuracy.repeat=5",
                                                  "accuracy.concurrency=100"])
    assert r.accuracy.train and r.accuracy.threshold == 0.88 and not r.accuracy.chat

