"""GSM8K exactly as lm-evaluation-harness 0.4.13 runs its `gsm8k` task (5-shot).

Data, per-question few-shot sampling, prompts (plain and chat), request bodies, the two
filters ("strict-match", "flexible-extract"), exact_match and the result figures. Pure and
stdlib-only: the gate (launcher/clients/accuracy.py), the tests and anyone checking a number
share one definition. Every rule here is a fact of lm-eval's code, with its source, in
docs/gsm8k.md; tests/test_gsm8k_lmeval.py holds this module to the real package.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TASK = "gsm8k"
NUM_SHOTS = 5  # the task's num_fewshot
FEWSHOT_SEED = 1234  # lm-eval's default fewshot_random_seed (4th slot of --seed)
REQUEST_SEED = 1234  # the "seed" lm-eval's API models put in every request body
MAX_TOKENS = 256  # lm-eval's API models' max_gen_toks
STOP = ("Question:", "</s>", "<|im_end|>")  # the task's generation_kwargs.until
INVALID = "[invalid]"  # what a filter returns when its regex finds nothing
STRICT = "strict-match"
FLEXIBLE = "flexible-extract"
METRICS = (STRICT, FLEXIBLE)

_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
# exact_match's regexes_to_ignore, applied in this order to both sides.
_IGNORE = tuple(re.compile(p) for p in (",", r"\$", "(?s).*#### ", r"\.$"))

Doc = dict[str, str]


class DataError(ValueError):
    """A GSM8K file or setting cannot be used; the message names what to fix."""


def load_jsonl(path: str | Path) -> list[Doc]:
    """GSM8K jsonl rows ({"question", "answer"} with the answer ending "#### N"), in file order.

    File order matters: lm-eval's sampler draws from the train rows as a list, and asks the
    test rows in order. Only the two fields are kept (other keys are not part of GSM8K).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"GSM8K file {p} does not exist; give a local GSM8K-format jsonl file.")
    docs: list[Doc] = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise DataError(f"{p} line {n} is not JSON; the file must be GSM8K "
                                "jsonl.") from None
            if not (isinstance(row, dict) and isinstance(row.get("question"), str)
                    and isinstance(row.get("answer"), str)):
                raise DataError(f"{p} line {n} needs string fields 'question' and 'answer'.")
            if "#### " not in row["answer"]:
                raise DataError(f"{p} line {n}: the answer does not contain '#### N', so it "
                                "is not GSM8K format.")
            docs.append({"question": row["question"], "answer": row["answer"]})
    if not docs:
        raise DataError(f"{p} has no rows; give a GSM8K-format jsonl file.")
    return docs


def sample_fewshot(docs: Sequence[Doc], pool: Sequence[Doc], num_shots: int = NUM_SHOTS, *,
                   seed: int = FEWSHOT_SEED, pool_is_eval_split: bool = False) -> list[list[Doc]]:
    """The few-shot examples of each doc, in the order lm-eval draws them.

    One random.Random(seed) for the whole run, one .sample(pool, k) per doc, docs in order:
    so the examples of question i depend on every draw before it, and asking the first N
    questions gives the same examples as lm-eval's --limit N. When the pool is the eval split
    itself (no train file), lm-eval draws k+1 and drops the question being asked.
    """
    if num_shots < 0:
        raise DataError("the number of shots must be 0 or more.")
    need = num_shots + 1 if pool_is_eval_split and num_shots else num_shots
    if need > len(pool):
        raise DataError(f"{num_shots}-shot sampling needs {need} few-shot rows but the pool "
                        f"has {len(pool)}; give a larger train file or fewer shots.")
    rnd = random.Random(seed)
    pool = list(pool)
    out: list[list[Doc]] = []
    for doc in docs:
        if num_shots == 0:
            out.append([])
        elif not pool_is_eval_split:
            out.append(rnd.sample(pool, num_shots))
        else:
            shots = [d for d in rnd.sample(pool, num_shots + 1) if d != doc][:num_shots]
            if len(shots) < num_shots:  # the pool holds copies of doc: draw again without them
                rest = [d for d in pool if d != doc]
                if len(rest) < num_shots:
                    raise DataError("too few rows differ from a question to sample its "
                                    "few-shot examples; give a train file.")
                shots = rnd.sample(rest, num_shots)
            out.append(shots)
    return out


def _question(doc: Doc) -> str:
    return f"Question: {doc['question']}\nAnswer:"  # the task's doc_to_text


def render_prompt(doc: Doc, shots: Sequence[Doc]) -> str:
    """The /v1/completions prompt: each example is question, " ", answer, "\\n\\n"; then the
    question, ending in "Answer:" with no space (the model writes the space)."""
    return "".join(f"{_question(s)} {s['answer']}\n\n" for s in shots) + _question(doc)


def render_messages(doc: Doc, shots: Sequence[Doc], *, multiturn: bool = True
                    ) -> list[dict[str, str]]:
    """The /v1/chat/completions messages of lm-eval's --apply_chat_template run.

    multiturn (lm-eval's default once a chat template is applied): one user turn per
    question and one assistant turn per worked answer, no delimiters. Otherwise one user
    message holding exactly the plain prompt. No system message: gsm8k has no description.
    """
    if not multiturn:
        return [{"role": "user", "content": render_prompt(doc, shots)}]
    messages: list[dict[str, str]] = []
    for s in shots:
        messages += [{"role": "user", "content": _question(s)},
                     {"role": "assistant", "content": s["answer"]}]
    return messages + [{"role": "user", "content": _question(doc)}]


def request_body(model: str, prompt: str | list[dict[str, str]], *,
                 max_tokens: int = MAX_TOKENS, seed: int = REQUEST_SEED) -> dict[str, Any]:
    """The JSON body lm-eval's local-completions (a prompt string) or local-chat-completions
    (a message list) sends: greedy, the task's stop list, the API models' fixed seed."""
    key = "prompt" if isinstance(prompt, str) else "messages"
    return {key: prompt, "model": model, "max_tokens": max_tokens, "temperature": 0.0,
            "stop": list(STOP), "seed": seed}


def strict_match(output: Any) -> str:
    """The number after the first "#### " (sign, digits, "." and "," only), else "[invalid]"."""
    m = _STRICT_RE.search(output if isinstance(output, str) else "")
    return m.group(1).strip() if m else INVALID


def flexible_extract(output: Any) -> str:
    """The last number-like run in the output (a "$", "," or "." run counts when 2+ long),
    else "[invalid]"."""
    found = _FLEXIBLE_RE.findall(output if isinstance(output, str) else "")
    if not found:
        return INVALID
    number, digits = found[-1]  # one of the two alternatives matched
    return (number or digits).strip()


def _prepare(text: str) -> str:
    # lm-eval's exact_match stores each regex pass back into a numpy string array, which
    # drops trailing NULs. (np.char.lower also cuts a lowercase that grows, U+0130, to the
    # old width; that cannot change a verdict, as filtered outputs are ASCII.)
    for rx in _IGNORE:
        text = rx.sub("", text).rstrip("\x00")
    return text.lower()


def reference(answer: str) -> str:
    """The gold answer as exact_match sees it: "#### 1,250." -> "1250"."""
    return _prepare(answer)


def exact_match(extracted: str, answer: str) -> bool:
    """lm-eval's gsm8k exact_match of a filtered output against the whole gold answer: drop
    ",", "$", everything up to the last "#### " and one final "."; ignore case; compare as
    strings (so "72.50" is not "72.5")."""
    return _prepare(extracted) == _prepare(answer)


def score(output: Any, answer: str) -> dict[str, dict[str, Any]]:
    """Both filters' extraction and verdict for one output."""
    res = {}
    for name, fn in ((STRICT, strict_match), (FLEXIBLE, flexible_extract)):
        extracted = fn(output)
        res[name] = {"extracted": extracted, "correct": exact_match(extracted, answer)}
    return res


def _stderr(hits: list[bool]) -> float | None:
    n = len(hits)
    if n < 2:
        return None
    mu = sum(hits) / n
    return math.sqrt(sum((h - mu) ** 2 for h in hits) / (n - 1)) / math.sqrt(n)  # lm-eval's


def summarize(docs: Sequence[Doc], outputs: Sequence[Any], *, num_shots: int,
              metric: str = STRICT, threshold: float | None = None) -> dict[str, Any]:
    """The result figures of one run: both filters' accuracy (with lm-eval's stderr) and
    invalid counts, and `accuracy`, `invalid_rate` and `passed` for the filter the
    threshold applies to."""
    if metric not in METRICS:
        raise DataError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}.")
    if len(docs) != len(outputs) or not docs:
        raise DataError("summarize needs one output per question, and at least one question.")
    scored = [score(o, d["answer"]) for d, o in zip(docs, outputs, strict=True)]
    n = len(docs)
    figures = {}
    for name in METRICS:
        hits = [s[name]["correct"] for s in scored]
        invalid = sum(s[name]["extracted"] == INVALID for s in scored)
        figures[name] = {"accuracy": sum(hits) / n, "stderr": _stderr(hits),
                         "invalid": invalid, "invalid_rate": invalid / n}
    acc = figures[metric]["accuracy"]
    return {"task": TASK, "metric": metric, "accuracy": acc,
            "invalid_rate": figures[metric]["invalid_rate"], "threshold": threshold,
            "passed": None if threshold is None else acc >= threshold,
            "num_questions": n, "num_shots": num_shots, "scores": figures,
            "per_question": scored}
