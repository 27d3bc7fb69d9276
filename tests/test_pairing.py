"""What prefill and decode must agree on for a hybrid P/D hand-over: one sentence per
mismatch, at dry-run from the recipe and in preflight from what the containers saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.control import preflight
from launcher.planning import pairing, plan, render
from launcher.schema import cluster, recipe

SEED = "qwen3.5-397b-gb200-disagg"
TINY_HYBRID = {  # a config.json with GDN layers: nothing in the recipe says "hybrid"
    "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": "bfloat16",
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
    "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "max_position_embeddings": 4096,
}  # fmt: skip


def side(role="prefill", **kw) -> pairing.Side:
    base = {"model": "/m", "served_name": "q", "env": {pairing.CONV_LAYOUT: "DS"}}
    return pairing.Side(role, **{**base, **kw})


@pytest.mark.parametrize("p, d, words", [
    ({"model": "/models/q"}, {"model": "org/q"}, "same model path literally"),
    ({"served_name": "a"}, {"served_name": "b"}, "same served model name"),
    ({"kv_cache_dtype": "fp8"}, {}, "same KV cache dtype"),
    ({"block_size": "64"}, {}, "same block size"),
    ({"tensor_parallel": 2}, {}, "same tensor parallel size"),
    ({}, {"env": {}}, "VLLM_SSM_CONV_STATE_LAYOUT: DS for decode"),
])  # fmt: skip
def test_each_mismatch_is_one_sentence(p, d, words):
    problems = pairing.disagreements(side("prefill", **p), side("decode", **d), hybrid=True)
    assert len(problems) == 1 and words in problems[0], problems
    assert pairing.disagreements(side("prefill"), side("decode"), hybrid=True) == []


def test_hybrid_only_rules_do_not_bind_a_dense_model():
    p, d = side("prefill", tensor_parallel=2, env={}), side("decode", env={})
    assert pairing.disagreements(p, d, hybrid=False) == []
    assert len(pairing.disagreements(p, d, hybrid=True)) == 2


def test_async_scheduling_needs_a_release_with_the_race_fixes():
    p, d = side("prefill", async_scheduling=True), side("decode", async_scheduling=True)
    (msg,) = pairing.disagreements(p, d, hybrid=True, engine_version="0.31.2")
    assert "needs vLLM 0.32 or later" in msg and "0.31.2" in msg and "#48481" in msg
    for ok in ("0.32.0+cpu", "0.33.0", None, "simulator"):
        assert pairing.disagreements(p, d, hybrid=True, engine_version=ok) == []


def _seed_doc(*sets: str):
    r = recipe.load(SEED, list(sets))
    c = cluster.load("gb200-nvl72")
    p = plan.make_plan(r, c, cluster.profile_nodes(c, plan.nodes_needed(r, c)))
    return p, render.plan_doc(p.at("/runs/r1"), "r1", placeholder_nodes=False)


def test_the_rendered_seed_commands_agree():
    p, doc = _seed_doc()
    engines = [x for x in doc.processes if x.kind == "engine" and not x.headless]
    sides = {x.role: pairing.side_of_argv(x.role, x.argv, x.env) for x in engines}
    assert sides["prefill"].model == sides["decode"].model == p.recipe.model.path
    assert sides["prefill"].async_scheduling and sides["decode"].async_scheduling
    assert preflight.judge_pairing(p, doc, {}) == []


def test_preflight_names_what_only_the_container_saw():
    # the engine's real version and the model's config.json as the container reads them
    p, doc = _seed_doc()
    old = {n: {"engine_version": "0.31.0", "model": {"hybrid": True}} for n in p.nodes}
    (msg,) = preflight.judge_pairing(p, doc, old)
    assert "needs vLLM 0.32 or later" in msg and "the engine is vLLM 0.31.0" in msg


@pytest.mark.parametrize("sets, words", [
    (["decode.env.VLLM_SSM_CONV_STATE_LAYOUT=ND"], "VLLM_SSM_CONV_STATE_LAYOUT: DS for decode"),
    (["prefill.args.kv-cache-dtype=fp8"], "same KV cache dtype"),
    (["prefill.tensor_parallel=2", "prefill.data_parallel=1"], "same tensor parallel size"),
])  # fmt: skip
def test_the_dry_run_refuses_a_hybrid_mismatch_in_one_sentence(cli, sets, words):
    args = [a for s in sets for a in ("--set", s)]
    code, out, err = cli("submit", SEED, "--dry-run", *args)
    assert code == 2 and words in err, (out, err)
    assert len(err.strip().splitlines()) == 1, err


def test_a_hybrid_known_only_from_config_json_gets_the_equal_tp_check(cli, tmp_path):
    model = tmp_path / "tiny-hybrid"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_HYBRID))
    code, out, err = cli("submit", "local-sim", "--dry-run", "--set", f"model.path={model}",
                         "--set", "prefill.tensor_parallel=2", "--set", "prefill.data_parallel=1")
    assert code == 2 and "hybrid (SSM) models need the same tensor parallel size" in err, err
    code, out, err = cli("submit", "local-sim", "--dry-run", "--set",
                         f"model.path={Path(model)}")
    assert code == 0, err
