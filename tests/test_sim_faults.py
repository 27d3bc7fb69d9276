"""Fault knobs for reliability tests, and GSM8K answers from an answer key."""

from __future__ import annotations

import json
import re
import time

import pytest
from simprocs import free_ports, http_json, kv_config, sample, scrape, start_sim

pytestmark = pytest.mark.timeout(60)


@pytest.mark.alone
def test_crash_after_exits_non_zero(tmp_path):
    p = start_sim(tmp_path, "agg-0", "m", SIM_CRASH_AFTER_S="1.5")
    try:
        p.wait_healthy(10)
        t0 = time.monotonic()
        code = p.proc.wait(10)
        assert code != 0
        assert time.monotonic() - t0 < 3
        assert "ERROR" in p.log_text() and "died unexpectedly" in p.log_text()
    finally:
        p.stop()


def test_hang_before_healthy_never_opens(tmp_path):
    p = start_sim(tmp_path, "agg-0", "m", SIM_HANG_BEFORE_HEALTHY="1")
    try:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert not p.healthy()
            time.sleep(0.1)
        assert p.proc.poll() is None  # alive, just never ready
    finally:
        assert p.stop() is not None


def test_slow_start_becomes_healthy_late(tmp_path):
    t0 = time.monotonic()
    p = start_sim(tmp_path, "agg-0", "m", "--sim-start-delay-s", "1.5")
    try:
        p.wait_healthy(10)
        assert time.monotonic() - t0 >= 1.5
    finally:
        p.stop()


def test_zero_tokens(tmp_path):
    p = start_sim(tmp_path, "agg-0", "m", SIM_ZERO_TOKENS="true", SIM_SPEED="20")
    try:
        p.wait_healthy(10)
        status, body = http_json(p.url + "/v1/completions",
                                 {"prompt": "hello", "max_tokens": 20, "ignore_eos": True})
        assert status == 200
        assert body["usage"]["completion_tokens"] == 0 and body["choices"][0]["text"] == ""
        assert sample(scrape(p.url), "vllm:generation_tokens_total") == 0
    finally:
        p.stop()


def _key(tmp_path) -> tuple[str, list[tuple[str, str]]]:
    rows = []
    for i in range(100):
        q = f"Tom has {i + 3} apples and buys {2 * i + 1} more. How many apples does he have?"
        rows.append((q, str(3 * i + 4)))
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text("".join(
        json.dumps({"question": q, "answer": f"He has {a} apples.\n#### {a}"}) + "\n"
        for q, a in rows))
    return str(path), rows


def _ask(url: str, rows: list[tuple[str, str]]) -> float:
    shots = "Question: What is 1 + 1?\nAnswer: 1 + 1 = 2. #### 2\n\n" * 3
    correct = 0
    for q, a in rows:
        status, body = http_json(url + "/v1/completions", {
            "prompt": shots + f"Question: {q}\nAnswer:", "max_tokens": 64,
            "stop": ["Question"]})
        assert status == 200
        choice = body["choices"][0]
        assert choice["finish_reason"] == "stop"  # answer, then EOS
        numbers = re.findall(r"-?\d+", choice["text"])
        correct += bool(numbers) and numbers[-1] == a
    return correct / len(rows)


@pytest.mark.parametrize("wrong", [False, True])
def test_answer_key_accuracy_and_collapse(tmp_path, wrong):
    key, rows = _key(tmp_path)
    env = {"SIM_ANSWER_KEY": key, "SIM_SPEED": "50"}
    if wrong:
        env["SIM_WRONG_ANSWERS"] = "1"
    p = start_sim(tmp_path, "agg-0", "m", **env)
    try:
        p.wait_healthy(10)
        accuracy = _ask(p.url, rows)
        if wrong:
            assert accuracy == 0.0
        else:
            assert 0.8 <= accuracy < 1.0  # SIM_ACCURACY 0.9, by a hash of each question
            assert _ask(p.url, rows) == accuracy  # deterministic
    finally:
        p.stop()


def test_filler_text_without_answer_key(tmp_path):
    p = start_sim(tmp_path, "agg-0", "m", SIM_SPEED="50")
    try:
        p.wait_healthy(10)
        status, body = http_json(p.url + "/v1/completions",
                                 {"prompt": "Question: 2+2?\nAnswer:", "max_tokens": 12})
        assert status == 200 and body["choices"][0]["finish_reason"] == "length"
        assert "####" not in body["choices"][0]["text"]
    finally:
        p.stop()


def test_kv_fail_fraction_fails_that_share_of_pulls(tmp_path):
    prefill = start_sim(tmp_path, "prefill-0", "m", "--kv-transfer-config",
                        kv_config("kv_producer"), SIM_SPEED="50",
                        VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)))
    decode = start_sim(tmp_path, "decode-0", "m", "--kv-transfer-config",
                       kv_config("kv_consumer"), SIM_SPEED="50", SIM_KV_FAIL_FRACTION="0.5",
                       VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)))
    try:
        prefill.wait_healthy(10)
        decode.wait_healthy(10)
        failed = 0
        for i in range(30):
            status, p = http_json(prefill.url + "/v1/completions", {
                "prompt": f"request {i} " * 50, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}},
                headers={"X-Request-Id": f"req-{i}"})
            assert status == 200
            status, _ = http_json(decode.url + "/v1/completions", {
                "prompt": f"request {i} " * 50, "max_tokens": 4,
                "kv_transfer_params": p["kv_transfer_params"]}, timeout=15)
            assert status in (200, 500)
            failed += status == 500
        assert 5 <= failed <= 25
        text = scrape(decode.url)
        assert sample(text, "vllm:nixl_num_failed_transfers_total") == failed
        assert sample(text, "vllm:nixl_bytes_transferred_count") == 30 - failed
    finally:
        prefill.stop()
        decode.stop()
