"""Recipe schema: errors name the key and the file; overrides reach any field."""

import os

import pytest
import yaml

from launcher.errors import UserError
from launcher.schema import cluster, recipe, sections

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
    assert "gdn-prefill-backend" not in r.vllm_args  # not in the published recipe
    assert r.vllm_args["no-enable-prefix-caching"] is True
    assert r.kv_connector["kv_role"] == "kv_both"
    assert r.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
    assert r.prefill.args["max-num-batched-tokens"] == 16384
    assert r.prefill.api_servers == r.decode.api_servers == 1
    assert (r.decode.endpoints, r.decode.data_parallel, r.decode.expert_parallel) == (1, 8, True)
    assert (r.prefill.endpoints, r.prefill.data_parallel) == (4, 2)
    b = r.benchmark
    assert (b.input_len, b.output_len, b.range_ratio) == (8192, 1024, 0.8)
    # the base recipes' points, then the -cc4096/-cc5120 recipes' with their decode setting
    assert b.concurrency == [64, 128, 256, 512, 1024, 2048, 3072, 4096, 5120]
    assert r.decode.args_from_concurrency == {4096: {"max-cudagraph-capture-size": 640},
                                              5120: {"max-cudagraph-capture-size": 768}}
    assert r.prefill.args_from_concurrency == {}
    assert (b.prompts_multiplier, b.warmup_multiplier) == (8, 1)
    assert r.accuracy.threshold == 0.88 and r.accuracy.task == "gsm8k"
    assert (r.accuracy.harness, r.accuracy.repeat) == ("vllm", 5)


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
    assert sections.SlurmSettings(time_limit="04:00:00").minutes == 240
    assert sections.SlurmSettings(time_limit="1-00:30").minutes == 1470
    assert sections.SlurmSettings(time_limit="90").minutes == 90


def test_invalid_yaml_is_one_line(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: x\ncluster: local\n  model: [\n")
    msg = _err(str(f))
    assert msg.startswith(f"{f}: not valid YAML at line 3") and "\n" not in msg


# --- inputs the dry-run fuzzing (tests/test_fuzz.py) found broken: one test per bug --------


def _file(tmp_path, text, name="r.yaml"):
    f = tmp_path / name
    f.write_text(text)
    return str(f)


def _seed_text(extra=""):
    return recipe.shipped()[SEED].read_text() + extra


@pytest.mark.parametrize("tag", ["!!timestamp 2024-01-01", "!!binary aGVsbG8=", "!!set {a, b}"])
def test_yaml_types_json_cannot_carry_are_refused(tmp_path, tag):
    # were a TypeError traceback when --kv-transfer-config was rendered
    msg = _err(_file(tmp_path, _seed_text(f"kv_connector: {{x: {tag}}}\n")))
    assert "not valid YAML at line" in msg and "are not supported" in msg


def test_nan_and_infinity_are_refused(tmp_path):
    # inf in the model facts was an OverflowError in the KV estimate; inf in kv_connector
    # became `Infinity`, which is not JSON
    facts = (
        "model: {path: m, facts: {total_params_b: .inf, full_attention_layers: 1, "
        "num_kv_heads: 1, head_dim: 1}}\n"
    )
    assert "model.facts.total_params_b: must be a finite number" in _err(
        _file(tmp_path, _seed_text(facts))
    )
    assert "kv_connector: it becomes vLLM's --kv-transfer-config JSON" in _err(
        _file(tmp_path, _seed_text("kv_connector: {x: .inf}\n"))
    )
    assert "hold_s: must be a finite number" in _err(SEED, "hold_s=.nan")


def test_model_facts_are_bounded(tmp_path):
    # 1e308 parameters overflowed to infinity inside the estimate (a traceback)
    msg = _err(SEED, "model.facts.total_params_b=1.0e+308")
    assert "model.facts.total_params_b: must be 100000 or less" in msg


def test_text_that_is_not_utf8_is_refused():
    # a lone surrogate (a YAML escape, or bytes that are not UTF-8 on the command line) was
    # a UnicodeEncodeError when commands.sh was written
    assert "env.X: '\\udcff' is not UTF-8 text" in _err(SEED, 'env.X="\\udcff"')


def test_yaml_is_bounded_in_size_values_depth_and_digits(tmp_path):
    assert "larger than 65,536 bytes" in _err(_file(tmp_path, _seed_text("#" + "x" * 70000)))
    assert "more than 5,000 values" in _err(SEED, "kv_connector.x=[" + "1," * 6000 + "1]")
    assert "nested more than 32 levels deep" in _err(SEED, "env.X=" + "[" * 40 + "]" * 40)
    assert "a number of 5,000 digits is too long" in _err(SEED, "kv_connector.x=" + "9" * 5000)


def test_a_directory_or_a_fifo_is_not_a_recipe_or_profile(tmp_path):
    # a directory was reported as "does not exist"; a FIFO must not block the reader
    (tmp_path / "d.yaml").mkdir()
    assert "is a directory" in _err(str(tmp_path / "d.yaml"))
    os.mkfifo(tmp_path / "f.yaml")
    assert "is not a regular file" in _err(str(tmp_path / "f.yaml"))
    for ref in (str(tmp_path / "d.yaml"), str(tmp_path / "f.yaml")):
        with pytest.raises(UserError, match="a cluster profile"):
            cluster.load(ref)


@pytest.mark.parametrize(
    "key, option",
    [("tim", "time"), ("part", "partition"), ("requ", "requeue"), ("arr", "array"), ("err", "error")],
)
def test_directive_abbreviating_an_option_the_launcher_sets_is_refused(key, option):
    # sbatch takes any unambiguous prefix, so these slipped past the list of owned options
    assert f"sbatch reads it as --{option}" in _err(SEED, f"slurm.directives.{key}=1")


def test_directive_values_sbatch_cannot_hold():
    assert "write true for a flag" in _err(SEED, "slurm.directives.exclusive=false")
    assert "the same sbatch option" in _err(
        SEED, "slurm.directives.comment=a", "slurm.directives.--comment=b"
    )
    # sbatch reads these words anywhere in an #SBATCH line as a job separator
    for setting in ("slurm.directives.comment=my-hetjob", "name=packjob", "slurm.partition=HETJOB"):
        assert "another job component" in _err(SEED, setting), setting
    # ... and unescapes backslashes even inside quotes
    assert "backslash" in _err(SEED, "slurm.directives.comment=a\\b")


def test_model_path_cannot_read_as_a_flag():
    assert "model.path: it begins with '-'" in _err(SEED, "model.path=--trust-remote-code")


def test_messages_quote_long_input_briefly():
    msg = _err(SEED, "env.X=[" + "x" * 5000)
    assert len(msg) < 300 and "..." in msg


def test_unexpandable_home_in_a_data_path_is_not_a_traceback(tmp_path):
    # Path.expanduser raised RuntimeError for an unknown user's ~
    text = _seed_text().replace("/datasets/gsm8k/test.jsonl", "~nosuchuser-x/test.jsonl")
    assert recipe.load(_file(tmp_path, text)).accuracy.data == "~nosuchuser-x/test.jsonl"


def _profile(tmp_path, **changes):
    data = yaml.safe_load(cluster.available()["local"].read_text())
    data.update(changes)
    return _file(tmp_path, yaml.safe_dump(data), "c.yaml")


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"env": {"-i": "x"}}, "env: -i is not a valid environment variable name"),
        ({"env": {"HF_TOKEN": "hf_x"}}, "env.HF_TOKEN is a secret (the Hugging Face access token)"),
        ({"bind_host": "a\nb"}, "bind_host: 'a\\nb' contains a newline"),
        ({"models": {"hf_home": "/a:/b"}}, "models.hf_home: it is mounted into containers"),
        ({"containers": {"mounts": ["/a"]}}, "containers.mounts: mount /a: write it as"),
        ({"gpu_memory_gib": 1e308}, "gpu_memory_gib: must be "),
    ],
)
def test_cluster_profile_values_are_checked(tmp_path, changes, words):
    # none of these were checked: a key '-i' became `env -i=x ...`, a secret's value and
    # newlines went into commands.sh, 1e308 overflowed in the KV estimate
    with pytest.raises(UserError) as e:
        cluster.load(_profile(tmp_path, **changes))
    assert words in str(e.value)


def test_node_list_errors_name_where_the_list_came_from():
    # unicode digits passed isdigit() and failed int(): a traceback
    with pytest.raises(UserError, match="^--nodelist: cannot read"):
        cluster.expand_nodelist("n[²-³]", "--nodelist")
    with pytest.raises(UserError, match="^--nodelist: n1,n1 names n1 twice"):
        cluster.expand_nodelist("n1,n1", "--nodelist")
    with pytest.raises(UserError, match="^node list: "):
        cluster.expand_nodelist("n[0-99999999]")


def test_a_set_into_a_defaulted_dict_adds_to_its_default():
    # kv_connector is not in local-sim's file: --set of one nested key keeps the connector
    from launcher.schema import recipe as recipe_mod

    r = recipe_mod.load("local-sim", ["kv_connector.kv_connector_extra_config.kv_lease_duration=1"])
    assert r.kv_connector["kv_connector"] == "NixlConnector"
    assert r.kv_connector["kv_connector_extra_config"] == {"backends": ["UCX"], "kv_lease_duration": 1}
