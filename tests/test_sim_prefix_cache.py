"""The simulated engine's prefix cache (docs/sim-prefix-cache.md): block hashes chained over
full blocks, LRU eviction of unreferenced cached blocks, the last token always recomputed,
and the counters and stats-line field vLLM 0.33 shows for it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import time

import pytest
from simprocs import free_ports, http_json, kv_config, sample, scrape, start_sim

from launcher.sim import statslog
from launcher.sim.cli import parse
from launcher.sim.engine import Engine, Req
from launcher.sim.prefix_cache import block_hashes

pytestmark = pytest.mark.timeout(90)

BS = 16


def _engine(blocks: int, caching: bool = True, **env: str) -> Engine:
    flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
    cfg = parse(["serve", "m", "--block-size", str(BS), "--num-gpu-blocks-override",
                 str(blocks), "--max-num-batched-tokens", "8192", flag],
                env={"SIM_SPEED": "200", **env})
    return Engine(cfg, 0, "e", "127.0.0.1")


_ids = iter(range(10**9))


def _req(e: Engine, ids: list[int]) -> Req:
    hashes = block_hashes(ids, BS) if e.pool.caching else None
    return Req(f"r{next(_ids)}", len(ids), 1, hashes=hashes)


async def _serve(e: Engine, prompts: list[list[int]]) -> list[Req]:
    """One request after the other (a replay at concurrency 1): the cache state each one
    meets is the one the previous ones left."""
    e.start()
    done = []
    for ids in prompts:
        req = _req(e, ids)
        e.add(req)
        while not req.finished:
            await req.event.wait()
            req.event.clear()
        assert req.finished == "length", req.finished
        done.append(req)
    return done


def _run(e: Engine, prompts: list[list[int]]) -> list[Req]:
    return asyncio.run(_serve(e, prompts))


def _stats_line(e: Engine) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        statslog.log_interval([e], aggregate=False)
    return out.getvalue()


def test_shared_three_block_prefix_hits_three_blocks_and_counters_and_log_agree():
    prefix = list(range(1000, 1000 + 3 * BS))
    a = prefix + list(range(5000, 5020))
    b = prefix + list(range(7000, 7020))
    e = _engine(200)
    ra, rb = _run(e, [a, b])
    assert ra.local_hit == 0
    assert rb.local_hit == 3 * BS
    c = e.stats.counters
    assert c["vllm:prefix_cache_queries"] == len(a) + len(b)
    assert c["vllm:prefix_cache_hits"] == 3 * BS
    assert c["vllm:prompt_tokens_by_source|local_cache_hit"] == 3 * BS
    assert c["vllm:prompt_tokens_by_source|local_compute"] == len(a) + len(b) - 3 * BS
    assert c["vllm:prompt_tokens_by_source|external_kv_transfer"] == 0
    assert c["vllm:prompt_tokens_cached"] == 3 * BS
    assert c["vllm:prompt_tokens_cached_by_source|device"] == 3 * BS
    rate = 100.0 * 3 * BS / (len(a) + len(b))
    assert f"Prefix cache hit rate: {rate:.1f}%" in _stats_line(e)
    # only the second request computed its tail: the computed-tokens histogram says so
    h = e.stats.hists["vllm:request_prefill_kv_computed_tokens"]
    assert h.sum == len(a) + len(b) - 3 * BS


def test_the_last_token_is_always_recomputed():
    # a prompt of exactly 3 full blocks, sent twice: the hit stops a block short, since
    # vLLM caps the hit at prompt length - 1 and hits are whole blocks
    p = list(range(200, 200 + 3 * BS))
    e = _engine(200)
    _, again = _run(e, [p, p])
    assert again.local_hit == 2 * BS
    # one token longer: all 3 blocks hit
    e2 = _engine(200)
    _, longer = _run(e2, [p, p + [9]])
    assert longer.local_hit == 3 * BS


def _sessions(n_sessions: int, turns: int, first: int, grow: int) -> list[list[int]]:
    """A cyclic replay: every session's turn t, then every session's turn t+1, ... Each
    turn's prompt is the session's previous prompt plus `grow` new tokens."""
    ctx = [[1_000_000 * (s + 1) + j for j in range(first)] for s in range(n_sessions)]
    out = []
    for t in range(turns):
        for s in range(n_sessions):
            if t:
                base = 1_000_000 * (s + 1) + len(ctx[s])
                ctx[s] = ctx[s] + [base + j for j in range(grow)]
            out.append(list(ctx[s]))
    return out


def _theoretical(prompts: list[list[int]]) -> float:
    """Hit rate with an infinite cache: the longest run of whole leading blocks (short of
    the last token) some earlier prompt had, counted from the token ids themselves."""
    seen: set[tuple[int, ...]] = set()
    hits = queries = 0
    for ids in prompts:
        queries += len(ids)
        k = 0
        while k < (len(ids) - 1) // BS and tuple(ids[:(k + 1) * BS]) in seen:
            k += 1
        hits += k * BS
        for j in range(1, len(ids) // BS + 1):
            seen.add(tuple(ids[:j * BS]))
    return 100.0 * hits / queries


def _achieved(e: Engine) -> float:
    c = e.stats.counters
    return 100.0 * c["vllm:prefix_cache_hits"] / c["vllm:prefix_cache_queries"]


def test_working_set_beyond_the_kv_pool_evicts_and_hits_fall_below_theoretical():
    # 8 sessions of 4..18 blocks: ~150 blocks of live prefixes at the end
    prompts = _sessions(8, 8, first=4 * BS, grow=2 * BS)
    theory = _theoretical(prompts)
    assert theory > 70  # a multi-turn replay is mostly reusable

    fits = _engine(4000)
    _run(fits, prompts)
    assert abs(_achieved(fits) - theory) <= 3, (_achieved(fits), theory)
    assert fits.pool.evictions == 0

    # 48 blocks: a session's context fits, all eight do not; LRU over a cyclic replay
    # evicts each session's blocks before its next turn comes back
    small = _engine(48)
    _run(small, prompts)
    assert small.pool.evictions > 0
    assert _achieved(small) < theory - 40, (_achieved(small), theory)
    line = _stats_line(small)
    got = float(re.search(r"Prefix cache hit rate: ([\d.]+)%", line).group(1))
    assert got < theory - 40, line


def test_a_hit_has_a_lower_ttft_than_a_miss_of_the_same_length():
    # SIM_SPEED 1: a 6000-token prefill is ~0.2 s of modelled time, a 16-token tail ~12 ms
    e = _engine(2000, SIM_SPEED="1")
    p = list(range(10, 6010))
    q = list(range(20000, 26000))
    miss, hit, other_miss = _run(e, [p, p, q])
    assert hit.local_hit == (len(p) - 1) // BS * BS
    ttft = [r.first_token - r.arrival for r in (miss, hit, other_miss)]
    assert ttft[1] < 0.5 * min(ttft[0], ttft[2]), ttft


def test_prefix_caching_disabled_never_hits():
    prefix = list(range(1000, 1000 + 3 * BS))
    e = _engine(200, caching=False)
    _run(e, [prefix + [1, 2, 3], prefix + [4, 5, 6], prefix + [1, 2, 3]])
    c = e.stats.counters
    assert c["vllm:prefix_cache_hits"] == 0
    assert c["vllm:prompt_tokens_by_source|local_cache_hit"] == 0
    # vLLM records no lookup with caching off: no queries, and no hit rate on the line
    assert c["vllm:prefix_cache_queries"] == 0
    line = _stats_line(e)
    assert "GPU KV cache usage" in line and "Prefix cache hit rate" not in line
    assert e.pool.cached == {}


def test_random_prompts_do_not_hit():
    # the fixed-length benchmark: distinct consecutive-id prompts from random offsets
    e = _engine(2000)
    _run(e, [list(range(start, start + 500)) for start in (17, 4242, 90001, 123, 77777)])
    assert e.stats.counters["vllm:prefix_cache_hits"] == 0
    assert e.stats.counters["vllm:prefix_cache_queries"] == 5 * 500


def test_served_over_http_text_and_chat_prompts_share_prefix_blocks(tmp_path):
    # the toy tokenizer: 4 characters a token, so 256 shared characters are 4 blocks of 16
    p = start_sim(tmp_path, "agg", "m", "--block-size", str(BS),
                  "--num-gpu-blocks-override", "400", SIM_SPEED="20",
                  VLLM_LOG_STATS_INTERVAL="0.3")
    try:
        p.wait_healthy(20)
        shared = "".join(f"line {i:03d} of the system prompt here.\n"[:32] for i in range(8))
        assert len(shared) == 256
        a = shared + "First question about the weather in Paris today?"
        b = shared + "Second question, quite different from the first one."
        for text in (a, b):
            status, body = http_json(p.url + "/v1/completions",
                                     {"prompt": text, "max_tokens": 2, "ignore_eos": True})
            assert status == 200, body
        text = scrape(p.url)
        queries = sample(text, "vllm:prefix_cache_queries_total")
        hits = sample(text, "vllm:prefix_cache_hits_total")
        assert queries == round(len(a) / 4) + round(len(b) / 4)
        assert hits == 64
        assert sample(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 64

        # a second chat turn carries the first turn's messages: its prefix hits
        turn1 = [{"role": "system", "content": shared},
                 {"role": "user", "content": "Write a haiku about caches, please."}]
        turn2 = turn1 + [{"role": "assistant", "content": "Blocks kept warm in HBM."},
                         {"role": "user", "content": "Now one about eviction."}]
        for msgs in (turn1, turn2):
            status, body = http_json(p.url + "/v1/chat/completions",
                                     {"messages": msgs, "max_tokens": 2, "ignore_eos": True})
            assert status == 200, body
        text = scrape(p.url)
        chat_hits = sample(text, "vllm:prefix_cache_hits_total") - hits
        # the system message and the first user message, in whole blocks: at least 4+1
        assert chat_hits >= 5 * BS, chat_hits
        # the stats line shows the same hit rate as the counters
        total = 100.0 * sample(text, "vllm:prefix_cache_hits_total") / sample(
            text, "vllm:prefix_cache_queries_total")
        deadline = time.monotonic() + 10
        want = f"Prefix cache hit rate: {total:.1f}%"
        while want not in p.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert want in p.log_path.read_text(), want
    finally:
        p.stop()


@pytest.mark.parametrize("prefix_len", [0, 64])
def test_the_fixed_length_benchmark_hits_only_its_shared_prefix(tmp_path, prefix_len):
    """The benchmark client's random-length, distinct-id prompts against a simulated engine
    with prefix caching on: no hits, as before the cache existed; with --random-prefix-len
    every request after the first hits the shared prefix's whole blocks."""
    from launcher.clients import bench

    p = start_sim(tmp_path, "agg", "toy-model", "--block-size", str(BS), SIM_SPEED="200")
    try:
        p.wait_healthy(20)
        cfg = bench.BenchConfig(model="toy-model", base_url=p.url, random_input_len=512,
                                random_output_len=8, num_prompts=40, max_concurrency=8,
                                num_warmups=0, random_prefix_len=prefix_len,
                                save_result=True,
                                result_dir=str(tmp_path / "bench"), result_filename="b.json")
        assert bench.run_point(cfg)["status"] == "ok"
        text = scrape(p.url)
        assert sample(text, "vllm:prefix_cache_queries_total") >= 40 * 256
        hits = sample(text, "vllm:prefix_cache_hits_total")
        assert hits == (0 if not prefix_len else 39 * (prefix_len // BS * BS)), hits
    finally:
        p.stop()


def test_hybrid_state_blocks_are_held_and_freed_but_never_cached():
    # a hybrid model's request also holds its recurrent-state blocks while it runs
    prefix = list(range(300, 300 + 3 * BS))
    e = _engine(60, SIM_STATE_BLOCKS_PER_REQUEST="3")
    a, b = _run(e, [prefix + [1] * 5, prefix + [2] * 5])
    assert b.local_hit == 3 * BS
    assert e.pool.num_free == 60 and e.kv_usage() == 0.0  # everything back in the queue
    assert len(e.pool.cached) == 3  # the prompt's full blocks, not the state blocks


def test_pd_decode_hits_its_own_cache_and_pulls_only_the_rest(tmp_path):
    """A session's second turn on P/D: the prefill computes only its new tail, and the decode
    finds the first turn's blocks in its own prefix cache and pulls only the rest over NIXL
    (vLLM's scheduler asks NixlConnector for the tokens past the local hit). Before, the
    sim's decode hit nothing and pulled every prompt again. The proportions are those real
    vLLM (CPU) P/D showed (tests/test_vllm_cpu.py, a dense model): the decode hits exactly
    what the prefill hits, and hit + pulled = its prompt tokens (nothing computed). The
    decode's cached blocks live under the same LRU: an unrelated prompt that fills its small
    pool evicts the session's tail blocks first, its head survives."""
    from launcher.sim.knobs import Knobs

    prefill = start_sim(tmp_path, "prefill-0", "m", "--block-size", str(BS),
                        "--kv-transfer-config", kv_config("kv_producer"), SIM_SPEED="20",
                        VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)))
    decode = start_sim(tmp_path, "decode-0", "m", "--block-size", str(BS),
                       "--num-gpu-blocks-override", "30",
                       "--kv-transfer-config", kv_config("kv_consumer"), SIM_SPEED="20",
                       VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)))

    def pd(ids: list[int]) -> None:
        status, p = http_json(prefill.url + "/v1/completions", {
            "prompt": ids, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        assert status == 200, p
        status, d = http_json(decode.url + "/v1/completions", {
            "prompt": ids, "max_tokens": 3,
            "kv_transfer_params": p["kv_transfer_params"]}, timeout=15)
        assert status == 200, d

    try:
        prefill.wait_healthy(10)
        decode.wait_healthy(10)
        turn1 = list(range(100, 100 + 10 * BS + 5))  # 10 full blocks and a tail
        turn2 = turn1 + list(range(5000, 5000 + 2 * BS + 3))  # the session's next turn
        pd(turn1)
        pd(turn2)
        pt, dt = scrape(prefill.url), scrape(decode.url)
        queries = len(turn1) + len(turn2)
        reused = 10 * BS  # turn 1's whole blocks (its last token's block is not whole)
        assert sample(pt, "vllm:prefix_cache_hits_total") == reused
        assert sample(dt, "vllm:prefix_cache_hits_total") == reused
        assert sample(dt, "vllm:prefix_cache_queries_total") == queries

        def by_source(source: str) -> float:
            return sample(dt, "vllm:prompt_tokens_by_source_total", source=source)

        pulled = queries - reused
        assert by_source("local_cache_hit") == reused
        assert by_source("external_kv_transfer") == pulled
        assert by_source("local_compute") == 0  # a dense model's decode computes none
        assert sample(dt, "vllm:prompt_tokens_cached_by_source_total", source="device") \
            == reused
        assert sample(dt, "vllm:prompt_tokens_cached_by_source_total", source="p2p") == pulled
        assert sample(dt, "vllm:external_prefix_cache_queries_total") == queries - reused
        assert sample(dt, "vllm:external_prefix_cache_hits_total") == pulled
        # the decode's KV computed per request is its prefill's (kv_transfer_params'
        # remote_prefill_cached_tokens), not its own
        assert sample(dt, "vllm:request_prefill_kv_computed_tokens_sum") == queries - reused
        # NIXL read turn 1 whole and of turn 2 only its blocks past the hit
        k = Knobs()
        assert sample(dt, "vllm:nixl_bytes_transferred_count") == 2
        assert sample(dt, "vllm:nixl_bytes_transferred_sum") == \
            pulled * k.kv_bytes_per_token + 2 * k.kv_state_bytes
        assert sample(dt, "vllm:nixl_num_descriptors_sum") == (11 + 3) * 60

        # 21 blocks of an unrelated prompt in the decode's 30: the free queue hands out
        # turn 2's tail first, and the 3rd turn (turn 2 again) finds 9 of its blocks
        pd(list(range(20000, 20000 + 20 * BS + 1)))
        before = sample(scrape(decode.url), "vllm:prefix_cache_hits_total")
        pd(turn2)
        dt = scrape(decode.url)
        assert sample(dt, "vllm:prefix_cache_hits_total") - before == 9 * BS
        assert sample(scrape(prefill.url), "vllm:prefix_cache_hits_total") == \
            reused + 12 * BS  # the prefill's big pool kept all of turn 2
    finally:
        prefill.stop()
        decode.stop()


def test_a_hybrid_decode_whose_hit_reaches_the_prefills_end_pulls_nothing_and_frees_it():
    """A hybrid (GDN/Mamba) model's prefill stops one token short, so its decode pulls
    prompt - 1 - hit tokens (vLLM's prefill backoff): a first P/D pull brings all but the
    last token; the same prompt again hits 3 blocks = prompt - 1 on the decode, so nothing
    is read over NIXL, no transfer is recorded, and the prefill is only told to free its
    held blocks. Two in-process engines over a real side channel."""
    from launcher.sim import nixl

    async def run() -> tuple[Engine, Engine]:
        port = free_ports(2)
        env = {"SIM_SPEED": "200", "SIM_STATE_BLOCKS_PER_REQUEST": "1",
               "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}

        def engine(role: str, side: int) -> Engine:
            cfg = parse(["serve", "m", "--block-size", str(BS), "--num-gpu-blocks-override",
                         "40", "--kv-transfer-config", kv_config(role)],
                        env={**env, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)})
            e = Engine(cfg, 0, role, "127.0.0.1")
            e.start()
            return e

        prefill, decode = engine("kv_producer", port), engine("kv_consumer", port + 1)
        decode.pull = nixl.make_pull(decode.cfg)
        read, done = nixl.local_handlers(prefill)
        server = await nixl.serve_side_channel("127.0.0.1", port, read, done, 5.0)
        ids = list(range(700, 700 + 3 * BS + 1))  # 3 full blocks and 1 token
        try:
            for i in range(2):
                p = Req(f"p{i}", len(ids), 1, remote_decode=True,
                        hashes=block_hashes(ids, BS))
                prefill.add(p)
                await p.event.wait()
                d = Req(f"d{i}", len(ids), 2, remote=p.kv_params,
                        hashes=block_hashes(ids, BS))
                decode.add(d)
                while not d.finished:
                    await d.event.wait()
                    d.event.clear()
                assert d.finished == "length" and not prefill.held, (d.error, prefill.held)
        finally:
            server.close()
        return prefill, decode

    _, decode = asyncio.run(run())
    c = decode.stats.counters
    assert c["vllm:prefix_cache_hits"] == 3 * BS
    assert c["vllm:prompt_tokens_by_source|external_kv_transfer"] == 3 * BS  # the first
    assert c["vllm:prompt_tokens_by_source|local_cache_hit"] == 3 * BS  # the second
    assert c["vllm:prompt_tokens_by_source|local_compute"] == 2  # each one's last token
    assert decode.stats.hists["vllm:nixl_bytes_transferred"].count == 1
