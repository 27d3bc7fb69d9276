"""launcher/clients/gsm8k.py against the REAL lm_eval 0.4.13 (its own gsm8k.yaml, sampler,
filters, exact_match and API-model request bodies), run in its own environment through
tests/lmeval/oracle.py. Missing lm_eval is a failure that names the install command."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from launcher.clients import gsm8k

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "gsm8k"
TRAIN, TEST = DATA / "train.jsonl", DATA / "test.jsonl"
ORACLE = ROOT / "tests" / "lmeval" / "oracle.py"
PYTHON = Path(os.environ.get("PD_LMEVAL_PYTHON", "/var/tmp/pd-lmeval/venv/bin/python"))
INSTALL = "bash tests/lmeval/setup.sh"


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("lmeval")
    checked: set[str] = set()
    env = {**os.environ, "HF_HOME": str(tmp / "hf"), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    def ask(request: dict[str, Any]) -> Any:
        if "installed" not in checked:  # in the test, so that it fails rather than errors
            probe = subprocess.run(
                [str(PYTHON), "-c", "import lm_eval; print(lm_eval.__version__)"],
                capture_output=True, text=True, check=False) if PYTHON.exists() else None
            if probe is None or probe.returncode != 0 or probe.stdout.strip() != "0.4.13":
                pytest.fail(f"lm_eval 0.4.13 is not installed at {PYTHON}: run `{INSTALL}` "
                            "(as root; PD_LMEVAL_PYTHON may name another environment's python)")
            checked.add("installed")
        path = tmp / "request.json"
        path.write_text(json.dumps(request))
        p = subprocess.run([str(PYTHON), str(ORACLE), str(path)], capture_output=True,
                           text=True, env=env, timeout=300, check=False)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout)
        assert out["lm_eval_version"] == "0.4.13"
        return out["result"]

    return ask


# (model output, gold answer): the hard cases of both filters and of exact_match.
CASES: list[tuple[Any, str]] = [
    ("#### 12", "#### 12"),
    (" She has 42 - 30 = 12 left.\n#### 12", "She has <<42-30=12>>12.\n#### 12"),
    ("#### 1,250.", "#### 1250"),
    ("#### 1,250", "Total 1,000 + 250.\n#### 1,250"),
    ("#### $18", "#### 18"),
    ("It costs $18", "#### 18"),
    ("#### 7\nwait\n#### 9", "#### 9"),
    ("#### 7\nwait\n#### 9", "#### 7"),
    ("####12", "#### 12"),
    ("####  4", "#### 4"),
    ("#### -4", "#### -4"),
    ("it is -4 degrees", "#### -4"),
    ("#### 4", "#### -4"),
    ("- 5", "#### -5"),
    ("Answer: -$5", "#### -5"),
    ("#### -0", "#### 0"),
    ("The answer is 18.", "#### 18"),
    ("The answer is 18", "#### 18"),
    ("So the answer is 18.\n#### 18", "#### 18"),
    ("the answer is $1,000.00.", "#### 1000"),
    ("#### 72.50", "#### 72.5"),
    ("#### 3.0", "#### 3"),
    ("#### 0.5", "#### .5"),
    ("#### .5", "#### .5"),
    ("#### 12.", "#### 12"),
    ("#### 12..", "#### 12"),
    ("#### 1.2.3", "#### 123"),
    ("#### 1e3", "#### 1000"),
    ("#### 2,000,000", "#### 2000000"),
    ("#### 1,000.50", "#### 1000.5"),
    ("#### ,5", "#### 5"),
    ("#### 5%", "#### 5"),
    ("#### 5 dollars", "#### 5"),
    ("#### five", "#### 5"),
    ("no number here", "#### 9"),
    ("", "#### 9"),
    (None, "#### 9"),
    ("#### 12\n\nQuestion: Tom has 99 apples", "#### 12"),
    ("She has 12 apples.\n\nQuestion: Tom has 5", "#### 12"),
    ("I think 3+4=7", "#### 7"),
    ("It ends at 10:30", "#### 30"),
    ("$ 5", "#### 5"),
    ("...", "#### 5"),
    ("Total: 1,234 apples; 56 left", "#### 56"),
    ("#### \uff14\uff12", "#### 42"),  # full-width digits are not [0-9]
    ("#### 4", "#### 4\n"),  # a gold answer with a trailing newline
    ("#### 4.", "#### 4.\n"),
    ("#### 7", "#### 7.\x00"),  # numpy drops trailing NULs after each regex pass
    ("nothing", "#### [INVALID]"),  # ignore_case applies to both sides
    ("nothing", "#### [\u0130nvalid]"),  # numpy's lower keeps the width
    ("#### 3\n" + "x 1 " * 200 + "#### 8", "#### 8"),
]


def test_filters_and_exact_match_are_lm_evals(oracle) -> None:
    assert len(CASES) >= 40
    theirs = oracle({"op": "score", "cases": [{"output": o, "answer": a} for o, a in CASES]})
    assert len(theirs) == len(CASES)
    mismatches = []
    for (output, answer), t in zip(CASES, theirs, strict=True):
        ours = gsm8k.score(output, answer)
        for name in gsm8k.METRICS:
            got = (ours[name]["extracted"], ours[name]["correct"])
            want = (t[name]["extracted"], t[name]["exact_match"] == 1.0)
            if got != want:
                mismatches.append((output, answer, name, got, want))
    assert not mismatches
    # the cases do tell the filters apart
    assert sum(t["strict-match"]["exact_match"] for t in theirs) not in (0, len(CASES))
    assert any(t["strict-match"]["exact_match"] != t["flexible-extract"]["exact_match"]
               for t in theirs)


def expected_bodies(docs: list[dict], pool: list[dict], *, limit: int | None, seed: int,
                    shots: int, same_split: bool) -> dict[str, list[dict]]:
    docs = docs[:limit] if limit else docs
    sampled = gsm8k.sample_fewshot(docs, pool, shots, seed=seed, pool_is_eval_split=same_split)
    pairs = list(zip(docs, sampled, strict=True))
    return {
        "plain": [gsm8k.request_body("m", gsm8k.render_prompt(d, s)) for d, s in pairs],
        "multiturn": [gsm8k.request_body("m", gsm8k.render_messages(d, s)) for d, s in pairs],
        "singleturn": [gsm8k.request_body("m", gsm8k.render_messages(d, s, multiturn=False))
                       for d, s in pairs],
    }


@pytest.mark.parametrize(("limit", "seed", "shots", "split"), [
    (None, 1234, None, "train"),  # lm-eval's defaults: every question, 5-shot, seed 1234
    (4, 42, 3, "train"),
    (None, 1234, None, "test"),  # no train file: examples from the questions' own split
])
def test_prompts_and_request_bodies_are_byte_identical(oracle, limit, seed, shots,
                                                       split) -> None:
    theirs = oracle({"op": "prompts", "train": str(TRAIN), "test": str(TEST), "limit": limit,
                     "seed": seed, "num_fewshot": shots, "fewshot_split": split})
    assert theirs["gen_kwargs"] == {"until": list(gsm8k.STOP), "do_sample": False,
                                    "temperature": 0.0}
    test = gsm8k.load_jsonl(TEST)
    pool = gsm8k.load_jsonl(TRAIN) if split == "train" else test
    ours = expected_bodies(test, pool, limit=limit, seed=seed, shots=shots or 5,
                           same_split=split == "test")
    for mode in ("plain", "multiturn", "singleturn"):
        assert [t["doc"] for t in theirs[mode]] == (test[:limit] if limit else test)
        got, want = [t["body"] for t in theirs[mode]], ours[mode]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert json.dumps(g, ensure_ascii=False) == json.dumps(w, ensure_ascii=False)
    # the examples really are train rows, five per question, drawn afresh for each
    assert theirs["plain"][0]["body"]["prompt"].count("Question: ") == (shots or 5) + 1


def test_same_split_sampling_with_copies_of_the_question(oracle, tmp_path: Path) -> None:
    """lm-eval draws k+1 from the split, drops every copy of the question, and draws again
    from the rest when fewer than k remain: the RNG use must match to the draw."""
    base = gsm8k.load_jsonl(TEST)[:5]
    rows = [base[0], base[1], base[0], base[2], base[0], base[3], base[4], base[0]]
    path = tmp_path / "dups.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    theirs = oracle({"op": "prompts", "train": str(TRAIN), "test": str(path), "limit": None,
                     "seed": 7, "num_fewshot": 3, "fewshot_split": "test"})
    ours = expected_bodies(rows, rows, limit=None, seed=7, shots=3, same_split=True)
    assert [t["body"] for t in theirs["plain"]] == ours["plain"]
