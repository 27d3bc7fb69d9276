"""Recipe schema: errors name the key and the file; overrides reach any field."""

import pytest

from launcher.errors import UserError
from launcher.spec import recipe

SEED = "qwen3.5-397b-gb200-disagg"


def test_shipped_recipes_load():
    names = set(recipe.shipped())
    assert {SEED, "qwen3.5-397b-gb200-agg", "local-sim", "devcluster-sim"} <= names
    for path in recipe.shipped().values():
        recipe.load(str(path))


def test_seed_recipe_holds_every_seed_setting():
    r = recipe.load(SEED)
    assert r.vllm_args["async-scheduling"] is True
    assert r.vllm_args["mamba-ssm-cache-dtype"] == "bfloat16"
    assert r.vllm_args["language-model-only"] is True
    assert r.vllm_args["stream-interval"] == 100
    assert r.vllm_args["gdn-prefill-backend"] == "flashinfer"
    assert r.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
    assert r.prefill.args["max-num-batched-tokens"] == 16384
    assert r.prefill.api_servers == r.decode.api_servers == 1
    assert (r.decode.endpoints, r.decode.data_parallel, r.decode.expert_parallel) == (1, 8, True)
    assert (r.prefill.endpoints, r.prefill.data_parallel) == (4, 2)
    b = r.benchmark
    assert (b.input_len, b.output_len, b.range_ratio) == (8192, 1024, 0.8)
    assert b.concurrency[0] == 64 and b.concurrency[-1] == 5120
    assert r.accuracy.threshold == 0.88 and r.accuracy.task == "gsm8k"


def _err(ref, *sets):
    with pytest.raises(UserError) as e:
        recipe.load(ref, list(sets))
    return str(e.value)


def test_unknown_key_names_key_and_file(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: x\ncluster: local\nmodel: {path: m}\nprefil: {endpoints: 1}\n")
    msg = _err(str(f))
    assert "unknown key 'prefil'" in msg and str(f) in msg


def test_nested_unknown_key_from_override():
    msg = _err(SEED, "decode.data_paralel=4")
    assert "with --set decode.data_paralel: unknown key 'decode.data_paralel'" in msg
    assert SEED in msg


def test_wrong_type_and_bad_value():
    assert "decode.data_parallel" in _err(SEED, "decode.data_parallel=lots")
    msg = _err(SEED, "benchmark.range_ratio=1.5")
    assert "benchmark.range_ratio" in msg and "1.5" in msg
    assert "every concurrency must be between 1 and" in _err(SEED, "benchmark.concurrency=[64,0]")
    assert "HH:MM" in _err(SEED, "slurm.time_limit=soon")


def test_missing_required_key(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: x\ncluster: local\n")
    assert "missing required key 'model'" in _err(str(f))


def test_mode_rules():
    assert "needs prefill.endpoints >= 1" in _err(SEED, "prefill.endpoints=0")
    assert "takes no prefill/decode" in _err("qwen3.5-397b-gb200-agg", "prefill.endpoints=2")


def test_overrides_reach_any_field():
    r = recipe.load(
        SEED,
        ["prefill.endpoints=8", "benchmark.concurrency=[1,2]", "slurm.account=abc",
         "prefill.args.max-num-seqs=512", "vllm_args.async-scheduling=null"],
    )  # fmt: skip
    assert r.prefill.endpoints == 8
    assert r.benchmark.concurrency == [1, 2]
    assert r.slurm.account == "abc"
    assert r.prefill.args["max-num-seqs"] == 512
    assert r.vllm_args["async-scheduling"] is None


def test_bad_override_syntax():
    assert "key.path=value" in _err(SEED, "prefill.endpoints")
    assert "is a value, not a section" in _err(SEED, "name.x=1")


def test_secret_values_are_refused():
    msg = _err(SEED, "env.HF_TOKEN=hf_abc")
    assert "env_from_host" in msg and "HF_TOKEN" in msg


def test_unknown_recipe_name_lists_choices():
    msg = _err("no-such-recipe")
    assert "local-sim" in msg and SEED in msg


def test_time_limit_minutes():
    assert recipe.Slurm(time_limit="04:00:00").minutes == 240
    assert recipe.Slurm(time_limit="1-00:30").minutes == 1470
    assert recipe.Slurm(time_limit="90").minutes == 90


def test_invalid_yaml_is_one_line(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: x\ncluster: local\n  model: [\n")
    msg = _err(str(f))
    assert msg.startswith(f"{f}: not valid YAML at line 3") and "\n" not in msg
