"""What the simulated model "says": GSM8K answers from an answer key, else filler text.

Tokens are words with a leading space, so the number of generated tokens is exact and
chunk text is cheap to build. With SIM_ANSWER_KEY, the last ``Question:`` block of the
prompt is looked up; a deterministic SIM_ACCURACY fraction of questions (by a hash of the
question) gets the right number, the rest (and all with SIM_WRONG_ANSWERS) a wrong one.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

_FILLER = ["the", "model", "is", "a", "simulated", "engine", "and", "this", "text", "is", "filler", "that", "stands", "in", "for", "real", "output", "of", "a", "large", "language", "model", "served", "with", "disaggregated", "prefill", "and", "decode", "on", "many", "GPUs", "so", "that", "throughput", "and", "latency", "can", "be", "measured", "without", "weights"]
FILLER_TOKENS = [" " + w for w in _FILLER]

_WS = re.compile(r"\s+")


def normalize(question: str) -> str:
    return _WS.sub(" ", question).strip()


def load_key(path: str) -> dict[str, str]:
    """Normalized question -> final answer (the text after '####')."""
    key: dict[str, str] = {}
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            answer = str(row.get("answer", ""))
            if "####" not in answer:
                continue
            final = answer.rsplit("####", 1)[1].strip().replace(",", "")
            key[normalize(str(row.get("question", "")))] = final
    return key


def last_question(prompt: str) -> str | None:
    idx = prompt.rfind("Question:")
    if idx < 0:
        return None
    body = prompt[idx + len("Question:"):]
    end = body.find("Answer:")
    if end >= 0:
        body = body[:end]
    return normalize(body)


def _unit(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def _wrong(final: str, question: str) -> str:
    offset = 1 + int(_unit("wrong:" + question) * 9)
    try:
        value = float(final)
    except ValueError:
        return final + "1"
    wrong = value + offset
    return str(int(wrong)) if wrong.is_integer() else str(wrong)


class Answerer:
    def __init__(self, key_path: str, accuracy: float, wrong_answers: bool) -> None:
        self.key = load_key(key_path) if key_path else {}
        self.accuracy = accuracy
        self.wrong_answers = wrong_answers

    def answer_tokens(self, prompt: str) -> list[str] | None:
        """Tokens of the answer to the prompt's last question, or None (filler text)."""
        if not self.key:
            return None
        question = last_question(prompt)
        if question is None or question not in self.key:
            question = normalize(prompt)  # a chat message that is just the question
            if question not in self.key:
                return None
        final = self.key[question]
        correct = not self.wrong_answers and _unit(question) < self.accuracy
        number = final if correct else _wrong(final, question)
        text = f"Let's compute it step by step. #### {number}"  # GSM8K's own answer format
        return [" " + w for w in text.split()]


def text_of(answer: list[str] | None, start: int, end: int) -> str:
    """Text of generated tokens [start, end)."""
    n = len(FILLER_TOKENS)
    if answer is None:
        return "".join(FILLER_TOKENS[i % n] for i in range(start, end))
    a = len(answer)
    return "".join(answer[i] if i < a else FILLER_TOKENS[i % n] for i in range(start, end))
