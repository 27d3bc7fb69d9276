"""The sim's command line is as strict as vLLM 0.33's `vllm serve`; render endpoints answer 403
without --enable-scale-out; start-up writes vLLM's checkpoint-loading lines; UCX_PROTO_INFO=y
prints UCX's protocol table at a decode's first KV read."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from simprocs import free_ports, http_json, kv_config, sim_env, start_sim

from launcher.sim import argv, loading, ucx, vllm_flags
from launcher.sim.argv import VllmArgError, VllmStartupError
from launcher.sim.cli import parse

ROOT = Path(__file__).resolve().parents[1]
SERVE_USAGE = "usage: vllm serve [model_tag] [options]\n"
TOP_USAGE = "usage: " + vllm_flags.PARSER["top_usage"] + "\n"


def run_sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher.sim", "serve", *args],
                          capture_output=True, text=True, timeout=30,
                          env=sim_env(COLUMNS="80"))


def test_unknown_flag_is_vllms_argparse_error_exit_2():
    p = run_sim("m", "--my-new-flag", "value", "--tensor-parallel-size", "1")
    assert p.returncode == 2
    assert p.stderr == TOP_USAGE + "vllm: error: unrecognized arguments: --my-new-flag value\n"
    assert p.stdout == ""  # nothing started


def test_bad_choices_exit_2_with_vllms_message():
    p = run_sim("m", "--gdn-prefill-backend", "auto")
    assert p.returncode == 2
    assert p.stderr == SERVE_USAGE + (
        "vllm serve: error: argument --gdn-prefill-backend: invalid choice: 'auto' (choose from "
        "'flashinfer', 'triton', 'cutedsl', 'aiter_flydsl', 'sycl')\n")
    p = run_sim("m", "--mamba-ssm-cache-dtype", "bf16")
    assert p.returncode == 2
    assert p.stderr == SERVE_USAGE + (
        "vllm serve: error: argument --mamba-ssm-cache-dtype: invalid choice: 'bf16' (choose "
        "from 'auto', 'bfloat16', 'float16', 'float32')\n")


def test_same_text_as_vllms_own_parser(monkeypatch):
    """Golden file: each argv run through vLLM 0.33.0's real parser (record_vllm_argv_cases)."""
    monkeypatch.setenv("COLUMNS", "80")
    data = json.loads((ROOT / "tests" / "data" / "vllm_argv_cases.json").read_text())
    assert data["vllm"] == vllm_flags.VLLM_VERSION and len(data["cases"]) >= 30
    for case in data["cases"]:
        try:
            argv.parse(case["argv"], lambda where, msg: None)
            code, text = 0, ""
        except VllmArgError as exc:
            code, text = exc.code, exc.text
        # vLLM's text names a function by address (<function loads at 0x7f...>)
        want = re.sub(r" at 0x[0-9a-f]+>", ">", case["stderr"])
        assert (code, text) == (case["exit"], want), case["argv"]


def _parse(*args: str):
    return argv.parse(["serve", "m", *args], lambda where, msg: None)


def test_value_errors_are_argparse_errors():
    cases = {
        ("-tp", "two"): "argument --tensor-parallel-size/-tp: invalid int value: 'two'",
        ("--max-model-len", "1.5K"): "argument --max-model-len: Decimals are not allowed with "
                                     "binary suffixes like K. Did you mean to use 1.5k instead?",
        ("--num-gpu-blocks-override", "x"): "argument --num-gpu-blocks-override: Value x cannot "
                                            "be converted to <class 'int'>.",
        ("--enable-prefix-caching=1",): "argument --enable-prefix-caching/--disable-prefix-"
                                        "caching: ignored explicit argument '1'",
        ("--all2all-backend", "deepep"): "argument --all2all-backend: invalid choice: 'deepep'",
        ("--enable",): "ambiguous option: --enable could match",
        ("--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_rol": "kv_producer"}'):
            "kv_rol\n  Unexpected keyword argument [type=unexpected_keyword_argument",
        ("--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "producer"}'):
            "kv_role\n  Input should be 'kv_producer', 'kv_both' or 'kv_consumer' "
            "[type=literal_error, input_value='producer', input_type=str]",
        ("--compilation-config", "[1]"): "Input should be an object [type=dataclass_type",
        ("--lora-modules", "{x"): "Invalid JSON format for --lora-modules: {x",
    }
    for args, message in cases.items():
        with pytest.raises(VllmArgError) as err:
            _parse(*args)
        assert err.value.code == 2
        assert message in err.value.text, (args, err.value.text)
        assert err.value.text.startswith(SERVE_USAGE), err.value.text


def test_every_vllm_033_flag_is_accepted():
    """Each option string of the table (visible, hidden, short and --no-/--disable- forms)."""
    samples = {"int": "2", "float": "0.5", "human_readable_int": "1k",
               "human_readable_int_or_auto": "auto", "json.loads": "{}",
               "union_dict_and_str": "x", "lower_underscore": "auto"}
    n = 0
    for rec in vllm_flags.FLAGS:
        if rec["action"] == "help" or rec["dest"] in ("config", "model"):  # tested below
            continue
        for opt in rec["options"] + rec.get("hidden_options", []):
            if rec["action"] in ("bool", "store_true"):
                args: list[str] = [opt]
            elif rec["action"] == "lora_modules":
                args = [opt, "a=/b"]
            elif rec.get("nargs") == "?":
                args = [opt]
            elif "choices" in rec:
                args = [opt, next(str(c) for c in rec["choices"] if c is not None)]
            else:
                kind = rec.get("type", "str").removeprefix("optional:").removeprefix("parse_type:")
                value = "{}" if kind.startswith("dataclass:") else samples.get(kind, "x")
                args = [opt, value]
            ns, given = _parse(*args)
            assert rec["dest"] in given, (opt, given)
            if rec["action"] == "bool":
                assert getattr(ns, rec["dest"]) is (opt not in rec["negative"]), opt
            n += 1
    assert n > 450


def test_flexible_parser_forms_like_vllm(tmp_path):
    ns, given = _parse("--max_num_seqs=8", "-dp", "4", "--no-async-scheduling", "-O3",
                       "--kv-transfer-config.kv_connector", "NixlConnector",
                       "--kv_transfer_config.kv_role", "kv_consumer",
                       "--max-num-batched-tokens", "8k", "--served-model-name", "a", "b")
    assert ns.max_num_seqs == 8 and ns.data_parallel_size == 4
    assert ns.async_scheduling is False and ns.optimization_level == "3"
    assert ns.kv_transfer_config == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    assert ns.max_num_batched_tokens == 8000 and ns.served_model_name == ["a", "b"]
    ns, _ = _parse("--max-num-seq", "3")  # an unambiguous prefix (argparse's allow_abbrev)
    assert ns.max_num_seqs == 3
    # --model after serve becomes the positional model, with vLLM's warning
    warnings: list[tuple[str, str]] = []
    ns, _ = argv.parse(["serve", "--model", "m2", "-tp", "2"],
                       lambda where, msg: warnings.append((where, msg)))
    assert ns.model_tag == "m2" and "positional argument" in warnings[0][1]
    with pytest.raises(VllmStartupError, match="first positional argument"):
        argv.parse(["serve", "-tp", "2", "--served-model-name", "x"], lambda w, m: None)
    # --config FILE: YAML, CLI wins over the file; false booleans become --no-...
    cfg_file = tmp_path / "serve.yaml"
    cfg_file.write_text("max-num-seqs: 64\nasync-scheduling: false\ntensor-parallel-size: 2\n"
                        "kv-transfer-config:\n  kv_connector: NixlConnector\n"
                        "  kv_role: kv_producer\n")
    ns, given = _parse("--config", str(cfg_file), "--max-num-seqs", "32")
    assert ns.max_num_seqs == 32 and ns.tensor_parallel_size == 2
    assert ns.async_scheduling is False and ns.kv_transfer_config["kv_role"] == "kv_producer"
    with pytest.raises(VllmStartupError, match="yaml/yml"):
        _parse("--config", str(tmp_path / "serve.json"))
    # duplicate dotted keys: vLLM's warning
    warnings.clear()
    argv.parse(["serve", "m", "--kv-transfer-config.kv_role", "kv_producer",
                "--kv-transfer-config.kv_role", "kv_consumer"],
               lambda where, msg: warnings.append((where, msg)))
    assert warnings == [("argparse_utils.py:495",
                         "Found duplicate keys --kv-transfer-config.kv_role")]


def _serve_argvs() -> list[tuple[str, list[str]]]:
    out = []
    for path in sorted((ROOT / "slurm" / "examples").glob("*/commands.sh")):
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#") or " serve " not in line:
                continue
            toks = shlex.split(line)
            i = next((i for i, t in enumerate(toks) if t == "serve" and i > 0 and (
                toks[i - 1] in ("vllm", "launcher.sim") or toks[i - 1].endswith("/vllm"))), None)
            if i is None:  # e.g. an echo that mentions serve
                continue
            args = []
            for t in toks[i:]:
                if t in (">", ">>", "&", "&&", "|", "2>&1") or t.startswith(">"):
                    break
                args.append(t)
            out.append((f"{path.parent.name}: {' '.join(args)[:80]}", args))
    return out


# Recipes written for another vLLM than 0.33 (the srt-slurm imports of 0.20/0.21 images, the
# agentic one of a 0.34 nightly): their flags are the image's parser's to judge, in the
# preflight. What 0.33 refuses of them is one attention-config key each, and the simulated
# runs set it to null
# (slurm/examples/simulate_shipped.py, docs/srt-slurm.md).
OLDER_VLLM_KEYS = ("use_trtllm_ragged_deepseek_prefill", "use_fp4_indexer_cache")


def test_every_shipped_recipe_argv_is_accepted():
    from launcher.schema import recipe

    argvs = _serve_argvs()
    names = {n.split(":")[0] for n, _ in argvs}
    assert {"local-sim", "devcluster-sim", "qwen3.5-397b-gb200-disagg",
            "qwen3.5-397b-gb200-agg"} <= names
    shipped = recipe.shipped()
    older = set()
    for name, args in argvs:
        base = name.split(":")[0]
        version = recipe.load(str(shipped[base])).engine_version if base in shipped else None
        if base not in shipped:  # an imported golden: its dry-run names the version
            said = re.search(r"vLLM (\S+) \(engine_version\)",
                             (ROOT / "slurm" / "examples" / base / "dry-run.txt").read_text())
            version = said.group(1) if said else None
        try:
            cfg = parse(args, env={})
        except VllmArgError as exc:  # pragma: no cover - the failure message is the point
            if version and not version.startswith("0.33") and any(
                    k in exc.text for k in OLDER_VLLM_KEYS):
                older.add(base)
                continue
            pytest.fail(f"{name}: {exc.text}")
        assert cfg.model, name
    # the Kimi-K2.5 8, the DeepSeek-V4-Pro MTP 3 and InferenceX's two agentic DeepSeek-V4
    # (0.34: the agentx one and the one with a Mooncake store)
    assert len(older) == 13, older


def test_usage_lines_match_vllm_parser_table(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # what a batch job without a terminal gets
    top, serve = argv.build(None)
    assert top.format_usage() == TOP_USAGE
    assert serve.format_usage() == SERVE_USAGE


# ----- HTTP: render endpoints, loading lines, UCX table ----------------------------------------


def _post(url: str, body: dict) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def test_render_403_without_scale_out_and_loading_lines(tmp_path):
    plain = start_sim(tmp_path, "plain", "m", "--max-model-len", "4096", SIM_START_DELAY_S="1.2",
                      SIM_CHECKPOINT_SHARDS="4", SIM_MODEL_WEIGHTS_GIB="12.5")
    scale = start_sim(tmp_path, "scale", "m", "--max-model-len", "4096", "--enable-scale-out")
    t0 = time.monotonic()
    try:
        plain.wait_healthy(20)
        assert time.monotonic() - t0 >= 1.2
        scale.wait_healthy(20)
        for path, body in (("/v1/completions/render", {"prompt": "hi", "max_tokens": 4}),
                           ("/v1/chat/completions/render",
                            {"messages": [{"role": "user", "content": "hi"}]})):
            status, raw, ctype = _post(plain.url + path, body)
            assert status == 403 and ctype.startswith("application/json")
            assert raw == (b'{"error":{"message":"Scale-out endpoints are disabled. Restart '
                           b'vllm serve with --enable-scale-out to enable them.","type":'
                           b'"PermissionDeniedError","param":null,"code":403}}')
            status, data = http_json(scale.url + path, body)
            assert status == 200 and data
        status, data = http_json(scale.url + "/v1/completions/render",
                                 {"model": "m", "prompt": "Hello there, how are you?"})
        assert status == 200 and isinstance(data, list) and data[0]["model"] == "m"
        assert data[0]["request_id"].startswith("cmpl-")
        assert data[0]["token_ids"] and all(isinstance(t, int) for t in data[0]["token_ids"])
        status, data = http_json(scale.url + "/v1/completions/render",
                                 {"model": "other", "prompt": "x"})
        assert status == 404 and "error" in data
        status, _ = http_json(plain.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 200  # generation itself is not affected
        log = plain.log_path.read_bytes()
    finally:
        plain.stop()
        scale.stop()
    text = log.decode()
    assert "[factories.py:105] Scale-out endpoints are disabled." in text
    bars = re.findall(r"\r(Loading safetensors checkpoint shards: +(\d+)% Completed \| "
                      r"(\d)/4 \[(\d\d:\d\d)<([0-9:?]+), +([0-9.?]+)(s/it|it/s)\]\n)", text)
    assert [b[2] for b in bars] == ["0", "1", "2", "3", "4", "4"], bars
    assert [b[1] for b in bars] == ["0", "25", "50", "75", "100", "100"]
    assert bars[0][0].endswith("0/4 [00:00<?, ?it/s]\n")
    assert bars[1][6] == "s/it" or float(bars[1][5]) < 4  # ~0.3 s a shard
    assert text.count("\n\r") >= 5 and "s/it]\n\n" in text or "it/s]\n\n" in text
    took = re.search(r"\(EngineCore pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d "
                     r"\[default_loader.py:506\] Loading weights took (\d+\.\d\d) seconds\n", text)
    assert took and 1.1 <= float(took.group(1)) < 5
    assert re.search(r"\(EngineCore pid=\d+\) INFO .* \[model_runner.py:428\] Model loading "
                     r"took 12.5 GiB memory and \d+\.\d{6} seconds\n", text)


def test_loading_bar_format_helpers():
    assert loading.bar_line(0, 2, 0.0) == (
        "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\n")
    assert loading.bar_line(1, 2, 1.3) == (
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.30s/it]\n")
    assert loading.bar_line(3, 4, 0.5).endswith("3/4 [00:00<00:00,  6.00it/s]\n")
    assert loading.format_interval(3725) == "1:02:05"


def test_ucx_proto_info_table_format():
    sel, lines = ucx.get_report("tcp", 1, 1, intra_node=False)
    assert sel == "remote memory read by ucp_get* into cuda/GPU1 from cuda/dev[1]"
    assert lines == [
        "+--------+--------------------+----------------------------------+",
        "| ucp_context_0 inter-node cfg#1                                 |",
        "| remote memory read by ucp_get* into cuda/GPU1 from cuda/dev[1] |",
        "+--------+--------------------+----------------------------------+",
        "| Range  |    Description     |              Config              |",
        "+--------+--------------------+----------------------------------+",
        "| 0..inf | software emulation | tcp/eth0                         |",
        "+--------+--------------------+----------------------------------+",
    ]
    assert ucx.transport("rc_mlx5/mlx5_3:1") == ("zero-copy", "rc_mlx5/mlx5_3:1")
    assert ucx.enabled({"UCX_PROTO_INFO": "y"}, sel)
    assert not ucx.enabled({"UCX_PROTO_INFO": "n"}, sel)
    assert not ucx.enabled({}, sel) and ucx.enabled({"UCX_LOG_LEVEL": "debug"}, sel)
    assert ucx.enabled({"UCX_PROTO_INFO": "*GET*GPU*"}, sel)
    assert re.fullmatch(r"\[\d+\.\d{6}\] \[[^:\]]+:\d+ *:0\]   ", ucx.compact_prefix())


def test_ucx_line_at_first_kv_transfer_on_decode(tmp_path):
    base_p, base_d = free_ports(1), free_ports(1)
    prefill = start_sim(tmp_path, "prefill", "m", "--kv-transfer-config",
                        kv_config("kv_producer"), "--max-model-len", "4096",
                        VLLM_NIXL_SIDE_CHANNEL_PORT=str(base_p), SIM_SPEED="50",
                        UCX_PROTO_INFO="y")
    decode = start_sim(tmp_path, "decode", "m", "--kv-transfer-config",
                       kv_config("kv_consumer"), "--max-model-len", "4096",
                       VLLM_NIXL_SIDE_CHANNEL_PORT=str(base_d), SIM_SPEED="50",
                       UCX_PROTO_INFO="y", SIM_UCX_TRANSPORT="tcp")
    try:
        prefill.wait_healthy(20)
        decode.wait_healthy(20)
        for i in range(2):
            status, p = http_json(prefill.url + "/v1/completions", {
                "prompt": f"question {i} " * 20, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}})
            assert status == 200 and p["kv_transfer_params"]["do_remote_prefill"]
            status, d = http_json(decode.url + "/v1/completions", {
                "prompt": f"question {i} " * 20, "max_tokens": 3,
                "kv_transfer_params": p["kv_transfer_params"]})
            assert status == 200, d
        log = decode.log_text()
        plog = prefill.log_text()
    finally:
        prefill.stop()
        decode.stop()
    rows = [line for line in log.splitlines() if re.match(r"\[\d+\.\d{6}\] \[", line)]
    assert len(rows) == 8, log[-3000:]  # one table: printed once, at the first read
    assert rows[2].endswith("| remote memory read by ucp_get* into cuda/GPU0 from cuda/dev[0] |")
    assert rows[6].endswith("| 0..inf | software emulation | tcp/eth0                         |")
    assert "ucp_get" not in plog  # the prefill does not read
