"""The simulator's KV tiers (launcher/sim/tiers.py, docs/sim-kv-tiers.md): simulated engines
that speak the Mooncake store for real (Mooncake's own client, the real mooncake_master over
TCP) and a modelled CPU offload tier, counted under vLLM 0.33's names."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
from simprocs import SimProc, free_ports, http_json, sample, scrape, start_sim

from launcher.sim import metrics, tiers
from launcher.sim.cli import parse
from launcher.sim.engine import Engine, Req
from launcher.sim.prefix_cache import block_hashes

pytestmark = pytest.mark.timeout(120)

MASTER = Path(os.environ.get("PD_MOONCAKE_MASTER", "/var/tmp/pd-mooncake/venv/bin/mooncake_master"))
STORE_PYTHON = str(MASTER.with_name("python"))
BS = 16


def multi(role: str, second: dict) -> str:
    return json.dumps({"kv_connector": "MultiConnector", "kv_role": role,
                       "kv_connector_extra_config": {"connectors": [
                           {"kv_connector": "NixlConnector", "kv_role": role},
                           {"kv_role": role, **second}]}})


def start_master(tmp_path: Path) -> tuple[SimProc, int]:
    if not MASTER.exists():
        pytest.fail(f"mooncake_master is not installed at {MASTER}: run `bash "
                    "tests/mooncake/setup.sh` (as root; PD_MOONCAKE_MASTER may name another)")
    rpc = free_ports(3)
    master = SimProc([str(MASTER), f"--port={rpc}", "--enable_http_metadata_server=true",
                      f"--http_metadata_server_port={rpc + 1}",
                      "--eviction_high_watermark_ratio=0.9", "--default_kv_lease_ttl=10000",
                      "--enable_metric_reporting=true", f"--metrics_port={rpc + 2}"],
                     dict(os.environ), tmp_path / "mooncake-master.log", port=rpc + 2).start()
    master.wait_healthy(20)
    return master, rpc


def master_metrics(master: SimProc) -> str:
    with urllib.request.urlopen(master.url + "/metrics", timeout=5) as r:
        return r.read().decode()


def complete(sim: SimProc, ids: list[int], **extra) -> dict:
    status, body = http_json(sim.url + "/v1/completions",
                             {"prompt": ids, "max_tokens": 1, **extra}, timeout=20)
    assert status == 200, body
    return body


def wait_until(what, timeout: float, why: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {why}")


def test_a_turn_the_prefill_evicted_is_served_from_the_real_store_and_counted_so(tmp_path):
    """P/D over NIXL + MooncakeStoreConnector, the real master: a session's first turn is put
    to the store; other prompts evict it from the prefill's GPU blocks; its second turn finds
    it by a real lookup, gets it from the store (tokens counted external, source
    external_unspecified, not computed), and the decode pulls over NIXL what its own prefix
    cache lacks (turn 1 whole, of turn 2 the part past turn 1's blocks)."""
    master, rpc = start_master(tmp_path)
    config = tmp_path / "mooncake_store_config.json"
    config.write_text(json.dumps({
        "metadata_server": "P2PHANDSHAKE", "protocol": "tcp", "device_name": "",
        "global_segment_size": "64MB", "local_buffer_size": "16MB",
        "master_server_address": f"127.0.0.1:{rpc}"}))
    env = {"PYTHONHASHSEED": "0", "MOONCAKE_CONFIG_PATH": str(config),
           "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1", "SIM_STORE_PYTHON": STORE_PYTHON,
           "SIM_SPEED": "20", "SIM_KV_BYTES_PER_TOKEN": "1024"}
    # the store clients' ports and their transfer engines': this test's own, not Mooncake's
    # 12300-14300 and 15000-17000 (other runs' ports)
    clients, engines = free_ports(16), free_ports(16)
    env.update(MC_STORE_CLIENT_MIN_PORT=str(clients), MC_STORE_CLIENT_MAX_PORT=str(clients + 15),
               MC_MIN_RPC_PORT=str(engines), MC_MAX_RPC_PORT=str(engines + 15))
    store = {"kv_connector": "MooncakeStoreConnector"}
    prefill = start_sim(tmp_path, "prefill-0", "m", "--block-size", str(BS),
                        "--num-gpu-blocks-override", "14",
                        "--kv-transfer-config", multi("kv_both", store),
                        VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)), **env)
    decode = start_sim(tmp_path, "decode-0", "m", "--block-size", str(BS),
                       "--kv-transfer-config", multi("kv_consumer", store),
                       VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)), **env)
    # two engines of their own on the same store: one with the same PYTHONHASHSEED, one not
    alone = json.dumps({**store, "kv_role": "kv_both"})
    peer = start_sim(tmp_path, "peer", "m", "--block-size", str(BS), "--kv-transfer-config",
                     alone, **env)
    stranger = start_sim(tmp_path, "stranger", "m", "--block-size", str(BS),
                         "--kv-transfer-config", alone, **{**env, "PYTHONHASHSEED": "1"})
    try:
        for sim in (prefill, decode, peer, stranger):
            sim.wait_healthy(30)
        turn1 = list(range(1000, 1000 + 5 * BS + 5))  # 5 full blocks and a tail
        turn2 = turn1 + list(range(9000, 9000 + 40))  # the next turn repeats the first

        def pd(ids: list[int]) -> None:
            p = complete(prefill, ids, kv_transfer_params={"do_remote_decode": True})
            complete(decode, ids, kv_transfer_params=p["kv_transfer_params"])

        pd(turn1)
        for other in (20000, 30000):  # 10 blocks each: the prefill's 14 cannot keep turn 1
            complete(prefill, list(range(other, other + 10 * BS + 3)))
        saved = wait_until(lambda: sample(scrape(prefill.url),
                                          "vllm:mooncake_store_operation_keys_total",
                                          operation="save_put", status="ok") >= 25,
                           20, "the prefill's puts (5 + 10 + 10 blocks)")
        assert saved
        pd(turn2)
        pt, dt = scrape(prefill.url), scrape(decode.url)
        hit = 5 * BS
        # the second turn: nothing local (evicted), turn 1's blocks from the store
        assert sample(pt, "vllm:prefix_cache_hits_total") == 0
        assert sample(pt, "vllm:prompt_tokens_by_source_total",
                      source="external_kv_transfer") == hit
        assert sample(pt, "vllm:prompt_tokens_cached_by_source_total",
                      source="external_unspecified") == hit
        assert sample(pt, "vllm:external_prefix_cache_hits_total") == hit
        computed = len(turn1) + 2 * (10 * BS + 3) + len(turn2) - hit
        assert sample(pt, "vllm:prompt_tokens_by_source_total",
                      source="local_compute") == computed
        # a real lookup and a real get, each block read back whole
        assert sample(pt, "vllm:mooncake_store_operation_keys_total",
                      operation="load_get", status="ok") == 5
        assert sample(pt, "vllm:mooncake_store_operation_bytes_total",
                      operation="load_get", status="ok") == 5 * BS * 1024
        assert sample(pt, "vllm:mooncake_store_operation_failed_keys_total") == 0
        assert sample(pt, "vllm:mooncake_store_operation_total", operation="lookup_exists") == 4
        assert sample(pt, "vllm:mooncake_store_operation_time_seconds_count",
                      operation="load_get") == 1
        # the decode puts nothing (kv_consumer), looks each prompt up (MultiConnector asks
        # every child); it kept turn 1's blocks, so of turn 2 it pulls only the rest
        assert sample(dt, "vllm:mooncake_store_operation_total", operation="save_put") == 0
        assert sample(dt, "vllm:mooncake_store_operation_total", operation="lookup_exists") == 2
        assert sample(dt, "vllm:prompt_tokens_cached_by_source_total",
                      source="device") == hit
        assert sample(dt, "vllm:prompt_tokens_cached_by_source_total",
                      source="p2p") == len(turn1) + len(turn2) - hit
        # the master saw it: the keys it holds, the replica lookups of the get
        mt = master_metrics(master)
        assert sample(mt, "master_key_count") >= 25
        assert sample(mt, "master_get_replica_list_requests_total") >= 5
        assert sample(mt, "master_batch_exist_key_items_total") > 0  # the lookups, the saves
        # another engine finds the session in the store (its hashes are the same with the same
        # seed); one with another seed computes it all: its keys never match (docs/kv-store.md)
        complete(peer, turn2)
        complete(stranger, turn2)
        shared = (len(turn2) - 1) // BS * BS  # turn 2's full blocks, short of its last token
        assert sample(scrape(peer.url), "vllm:prompt_tokens_cached_by_source_total",
                      source="external_unspecified") == shared
        st = scrape(stranger.url)
        assert sample(st, "vllm:mooncake_store_operation_total", operation="lookup_exists") == 1
        assert sample(st, "vllm:prompt_tokens_by_source_total",
                      source="external_kv_transfer") == 0
    finally:
        for sim in (prefill, decode, peer, stranger):
            sim.stop()
        master.stop()


# --- CPU offload, modelled (in-process engines: no store, nothing to start) -----------------


def _offload_engine(connector: str, cpu_bytes: int, gpu_blocks: int) -> Engine:
    kv = {"kv_connector": connector, "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes_to_use": cpu_bytes}}
    cfg = parse(["serve", "m", "--block-size", str(BS), "--num-gpu-blocks-override",
                 str(gpu_blocks), "--kv-transfer-config", json.dumps(kv)],
                env={"SIM_SPEED": "200", "SIM_KV_BYTES_PER_TOKEN": "1024",
                     "SIM_OFFLOAD_BANDWIDTH_GBPS": "2"})
    e = Engine(cfg, 0, "e", "127.0.0.1")
    client, kids = asyncio.run(tiers.open_tiers(cfg, env={}))
    assert client is None  # no store: no client process
    tiers.attach(e, kids, None)
    return e


def _serve_in_turn(e: Engine, prompts: list[list[int]]) -> list[Req]:
    async def go() -> list[Req]:
        e.start()
        out = []
        for i, ids in enumerate(prompts):
            req = Req(f"r{i}", len(ids), 1, hashes=block_hashes(ids, BS))
            e.add(req)
            while not req.finished:
                await req.event.wait()
                req.event.clear()
            assert req.finished == "length", (req.finished, req.error)
            out.append(req)
        return out

    return asyncio.run(go())


@pytest.mark.parametrize("connector", ["OffloadingConnector", "SimpleCPUOffloadConnector"])
def test_a_cpu_offload_tier_serves_what_the_gpu_evicted_at_its_copy_bandwidth(connector):
    block = BS * 1024
    e = _offload_engine(connector, cpu_bytes=40 * block, gpu_blocks=14)
    turn1 = list(range(1000, 1000 + 5 * BS + 5))
    others = [list(range(x, x + 10 * BS + 3)) for x in (20000, 30000)]
    *_, again = _serve_in_turn(e, [turn1, *others, turn1 + [7] * 20])
    c, off = e.stats.counters, e.stats.offload
    assert again.local_hit == 0 and again.external == 5 * BS  # evicted on the GPU, not on the host
    assert c["vllm:prompt_tokens_cached_by_source|host"] == 5 * BS
    assert c["vllm:prompt_tokens_by_source|external_kv_transfer"] == 5 * BS
    assert off.load_bytes == 5 * block and off.load_time == pytest.approx(5 * block / 2e9)
    assert off.store_bytes == (5 + 10 + 10 + 1) * block  # every full prompt block once
    text = metrics.render([e], "m", nixl=False, consumer=True, multiproc=False)
    if connector == "OffloadingConnector":  # the flat names and the deprecated ones
        assert sample(text, "vllm:kv_offload_load_bytes_total") == 5 * block
        assert sample(text, "vllm:kv_offload_total_bytes_total",
                      transfer_type="CPU_to_GPU") == 5 * block
        assert sample(text, "vllm:kv_offload_store_size_count") == 4
    else:
        assert sample(text, "vllm:simple_kv_offload_load_blocks_total") == 5
        assert sample(text, "vllm:simple_kv_offload_save_outcomes_total", outcome="stored") == 26
    assert "vllm:nixl_" not in text and "mooncake" not in text


def test_a_cpu_tier_too_small_for_a_prompt_keeps_only_its_tail_and_never_hits():
    block = BS * 1024
    e = _offload_engine("OffloadingConnector", cpu_bytes=3 * block, gpu_blocks=14)
    turn1 = list(range(1000, 1000 + 5 * BS + 5))
    others = [list(range(x, x + 10 * BS + 3)) for x in (20000, 30000)]
    *_, again = _serve_in_turn(e, [turn1, *others, turn1 + [7] * 20])
    assert again.external == 0 and e.stats.counters["vllm:prompt_tokens_cached_by_source|host"] == 0
    assert len(e.tiers[0].blocks) == 3  # LRU: the last prompt's last three blocks


def test_a_store_the_engine_cannot_reach_is_one_sentence_at_start(tmp_path):
    """What vLLM would raise at start, as one line: no MOONCAKE_CONFIG_PATH (vLLM's words),
    a store Python that does not run (SIM_STORE_PYTHON named), one without mooncake.store."""
    kv = json.dumps(json.loads(multi("kv_both", {"kv_connector": "MooncakeStoreConnector"})))

    def refusal(env: dict[str, str], python: str = "") -> str:
        cfg = parse(["serve", "m", "--kv-transfer-config", kv], env={"SIM_STORE_PYTHON": python})
        with pytest.raises(tiers.TierError) as e:
            asyncio.run(tiers.open_tiers(cfg, env=env))
        return str(e.value)

    assert refusal({}) == ("ValueError: The environment variable 'MOONCAKE_CONFIG_PATH' is "
                           "not set.")
    config = tmp_path / "store.json"
    config.write_text(json.dumps({"master_server_address": "127.0.0.1:1"}))
    env = {"MOONCAKE_CONFIG_PATH": str(config)}
    missing = str(tmp_path / "no-python")
    assert refusal(env, missing).startswith(
        f"cannot start the Mooncake store client with {missing} (SIM_STORE_PYTHON)")
    text = refusal(env, "/usr/bin/python3")  # a Python without Mooncake's client
    assert text.startswith("RuntimeError: Initialize MooncakeDistributedStore failed. (master "
                           "127.0.0.1:1, client /usr/bin/python3: the client printed nothing; "
                           "is mooncake.store importable there? SIM_STORE_PYTHON names it)")
    # the engine process says it and exits 1, as vLLM's engine core would fail to start
    sim = start_sim(tmp_path, "prefill-0", "m", "--kv-transfer-config", kv,
                    VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)))
    try:
        assert sim.proc.wait(30) == 1
        assert ("EngineCore failed to start: ValueError: The environment variable "
                "'MOONCAKE_CONFIG_PATH' is not set.") in sim.log_text()
    finally:
        sim.stop()


def test_a_simple_offload_size_per_rank_counts_every_rank_of_tp_and_pp():
    """cpu_bytes_to_use_per_rank times vLLM's world size (TP x PP), not TP alone."""
    kv = {"kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes_to_use_per_rank": 10 * BS * 1024}}
    cfg = parse(["serve", "m", "--block-size", str(BS), "--tensor-parallel-size", "2",
                 "--pipeline-parallel-size", "2", "--kv-transfer-config", json.dumps(kv)],
                env={"SIM_KV_BYTES_PER_TOKEN": "1024"})
    assert tiers.CpuTier(cfg, kv).capacity == 40
