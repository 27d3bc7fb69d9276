"""GSM8K gate: strict-match extraction on tricky outputs, and the gate end to end over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_bench import ServerConfig, serve_in_thread, sim_server

from launcher import accuracy

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "gsm8k_sample.jsonl"


@pytest.mark.parametrize(("output", "extracted"), [
    (" She has 42 - 30 = 12 left.\n#### 12", "12"),
    ("#### 1,250.", "1,250."),  # captured as lm-eval does; normalized later
    ("so it is 8 - 12 = -4 degrees.\n#### -4\n\n", "-4"),
    ("#### 7\nOn second thought\n#### 9", "7"),  # take_first
    ("####12", accuracy.INVALID),  # strict needs "#### " with the space
    ("#### $18", accuracy.INVALID),  # no "$" in the strict pattern
    ("So 5 + 4 = 9. The answer is 9.", "9."),  # the cot rule when there is no "####"
    ("The answer is 18", "18"),  # no character needed after the number (see the docstring)
    ("the answer is 18.", accuracy.INVALID),  # lm-eval's patterns are case-sensitive
    ("I think it is 42", accuracy.INVALID),  # strict, not flexible-extract
    ("The answer is 3.\n#### 4", "4"),  # "####" wins over "The answer is"
    ("", accuracy.INVALID),
])
def test_strict_match_extraction(output: str, extracted: str) -> None:
    assert accuracy.extract_answer(output) == extracted


@pytest.mark.parametrize(("output", "answer", "correct"), [
    ("#### 1,250.", "... #### 1250", True),  # commas and a trailing period are ignored
    ("#### 10000", "Each week 2000 * 5 = <<2000*5=10000>>10000 toys.\n#### 10000", True),
    ("#### -4", "#### -4", True),
    ("#### 4", "#### -4", False),
    ("#### 72.50", "#### 72.5", False),  # exact string match, as lm-eval: not numeric
    ("#### 3.0", "#### 3", False),
    ("The answer is 9.", "#### 9", True),
    ("no number here", "#### 9", False),
])
def test_scoring_against_the_reference(output: str, answer: str, correct: bool) -> None:
    assert accuracy.is_correct(output, answer)[1] is correct


def test_sample_file_is_well_formed() -> None:
    rows = accuracy.load_jsonl(SAMPLE)
    assert len(rows) >= 40
    assert len({r["question"] for r in rows}) == len(rows)
    for r in rows:
        ref = accuracy.reference_answer(r["answer"])
        assert str(int(ref)) == ref  # integer answers, as GSM8K's
        # the worked answer itself scores as correct under strict-match
        assert accuracy.is_correct(" " + r["answer"], r["answer"]) == (ref, True)


def test_shots_come_from_the_train_file_or_the_first_rows() -> None:
    rows = accuracy.load_jsonl(SAMPLE)
    shots, questions, source = accuracy.prepare(rows, None, 5, None)
    assert shots == rows[:5] and questions == rows[5:] and "not asked" in source
    shots, questions, _ = accuracy.prepare(rows[10:], rows[:10], 5, 7)
    assert shots == rows[:5] and questions == rows[10:17]
    prefix = accuracy.few_shot_prefix(rows[:2])
    assert prefix == (f"Question: {rows[0]['question']}\nAnswer: {rows[0]['answer']}\n\n"
                      f"Question: {rows[1]['question']}\nAnswer: {rows[1]['answer']}\n\n")
    with pytest.raises(accuracy.AccuracyError, match="no questions are left"):
        accuracy.prepare(rows[:5], None, 5, None)


def _key() -> dict[str, str]:
    return {r["question"]: r["answer"] for r in accuracy.load_jsonl(SAMPLE)}


def test_gate_passes_with_right_answers_and_sends_vllm_sampling(tmp_path: Path) -> None:
    with serve_in_thread(ServerConfig(answer_key=_key())) as (url, log):
        res = accuracy.run_gsm8k(url, "toy-model", SAMPLE, num_questions=20, concurrency=8)
    assert res["accuracy"] == 1.0 and res["passed"] is True and res["invalid_rate"] == 0.0
    assert res["num_questions"] == 20 and res["num_shots"] == 5
    assert len(res["records"]) == 20 and all(r["correct"] for r in res["records"])
    sent = log.requests
    assert len(sent) == 20
    assert all(r["stop"] == ["Question", "Assistant:", "<|separator|>"] for r in sent)
    assert all(r["temperature"] == 0.0 and r["max_tokens"] == 256 and not r["stream"]
               for r in sent)
    # 5-shot: five worked examples, then the question; the shots are never asked
    prompt = sent[0]["prompt"]
    assert prompt.count("Question: ") == 6 and prompt.endswith("\nAnswer:")
    asked = {r["question"] for r in res["records"]}
    shots = {r["question"] for r in accuracy.load_jsonl(SAMPLE)[:5]}
    assert not asked & shots


def test_gate_fails_with_wrong_answers_but_the_cli_still_succeeds(tmp_path: Path) -> None:
    out = tmp_path / "accuracy" / "gsm8k.json"
    with serve_in_thread(ServerConfig(answer_key=_key(), wrong_answers=True)) as (url, _):
        proc = subprocess.run(
            [sys.executable, "-m", "launcher.accuracy", "--base-url", url, "--model",
             "toy-model", "--data", str(SAMPLE), "--num-questions", "12", "--concurrency", "4",
             "--threshold", "0.88", "--output", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "FAILED" in proc.stdout and "accuracy 0.000" in proc.stdout
    res = json.loads(out.read_text())
    assert res["passed"] is False and res["accuracy"] == 0.0 and res["threshold"] == 0.88
    assert res["invalid_rate"] == 0.0  # wrong, not unparseable
    for k in ("accuracy", "invalid_rate", "num_questions", "num_shots", "threshold", "passed",
              "latency", "records"):
        assert k in res
    rec = res["records"][0]
    assert int(rec["extracted"]) == int(rec["reference"]) + 1 and rec["correct"] is False


def test_cli_errors_are_one_sentence(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher.accuracy", "--model", "m",
                               "--output", str(tmp_path / "a.json"), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=False)

    p = run("--base-url", "http://127.0.0.1:9", "--data", str(tmp_path / "missing.jsonl"))
    assert p.returncode == 2 and "does not exist" in p.stderr and "Traceback" not in p.stderr
    # a server that is not there: the file says what happened, the exit status says it failed
    p = run("--base-url", "http://127.0.0.1:9", "--data", str(SAMPLE), "--num-questions", "3")
    assert p.returncode == 1 and "no request" in p.stderr and "Traceback" not in p.stderr
    res = json.loads((tmp_path / "a.json").read_text())
    assert res["num_errors"] == 3 and res["passed"] is False


def test_gate_against_the_simulated_vllm(tmp_path: Path) -> None:
    """The sim answers "... The answer is N." from the key: right, then with its
    wrong-answers fault."""
    env = {"SIM_ANSWER_KEY": str(SAMPLE), "SIM_ACCURACY": "1.0"}
    with sim_server(env) as url:
        res = accuracy.run_gsm8k(url, "toy-model", SAMPLE, concurrency=16)
    assert res["num_questions"] == len(accuracy.load_jsonl(SAMPLE)) - 5
    assert res["accuracy"] == 1.0 and res["passed"] is True
    with sim_server({**env, "SIM_WRONG_ANSWERS": "1"}) as url:
        res = accuracy.run_gsm8k(url, "toy-model", SAMPLE, concurrency=16)
    assert res["passed"] is False and res["accuracy"] < 0.1 and res["invalid_rate"] == 0.0
