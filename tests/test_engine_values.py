"""Engine flags the dry-run refuses whatever vLLM the image holds: values no vLLM takes
(ranges and types that hold in every version), a misspelt flag the launcher itself reads
(the KV estimate), and Dynamo's own `dyn-*` options, which are not `vllm serve`'s."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import launcher

from launcher.control import prepare
from launcher.errors import UserError
from launcher.schema import srt_slurm

OLD = "launcher/recipes/srt-slurm/minimax-m2.5/minimax-m2.5-gb200-8k1k-1p1d-tp4.yaml"  # 0.20.1
SEED = "qwen3.5-397b-gb200-disagg"  # vLLM 0.33, whose parser the dry-run has
ROOT = Path(__file__).resolve().parents[1]


def refusal(tmp_path, recipe: str, *sets: str) -> str:
    ref = str(ROOT / recipe) if recipe.endswith(".yaml") else recipe
    with pytest.raises(UserError) as e:
        prepare.prepare_all(ref, list(sets), [], tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    return str(e.value)


@pytest.mark.parametrize("recipe", [OLD, SEED])
@pytest.mark.parametrize("setting,words", [
    ("decode.args.max-num-seqs=lots", "decode.args.max-num-seqs must be a whole number of 1 or more"),
    ("decode.args.max-num-seqs=0", "decode.args.max-num-seqs must be a whole number of 1 or more"),
    ("decode.args.max-num-seqs=true", "decode.args.max-num-seqs must be a whole number"),
    ("vllm_args.gpu-memory-utilization=1.5", "vllm_args.gpu-memory-utilization must be a fraction of the GPU's memory above 0 and at most 1"),
    ("prefill.args.gpu-memory-utilization=0", "prefill.args.gpu-memory-utilization must be a fraction"),
    ("decode.args.gpu-memory-utilization=most", "decode.args.gpu-memory-utilization must be a fraction"),
    ("decode.args.max-model-len=-5", "decode.args.max-model-len must be a whole number of 1 or more"),
    ("decode.args.max-model-len=long", "decode.args.max-model-len must be a whole number of 1 or more"),
    ("decode.args.block-size=0", "decode.args.block-size must be a whole number of 1 or more"),
    ("prefill.args.pipeline-parallel-size=0", "prefill.args.pipeline-parallel-size must be a whole number of 1 or more"),
    ("decode.args.max-num-batched-tokens=-1", "decode.args.max-num-batched-tokens must be a whole number of 1 or more"),
])
def test_a_value_no_vllm_takes_is_refused_in_one_sentence_naming_the_key(
        tmp_path, recipe, setting, words):
    msg = refusal(tmp_path, recipe, setting)
    assert words in msg, msg
    assert "ValueError" not in msg and "\n" not in msg


@pytest.mark.parametrize("setting", ["decode.args.max-model-len=32k", "decode.args.max-model-len=auto",
                                     "decode.args.max-model-len=-1", "decode.args.max-num-seqs=64",
                                     "decode.args.gpu-memory-utilization=1",
                                     "decode.args.max-num-batched-tokens=16k"])
def test_values_vllm_takes_pass(tmp_path, setting):
    prepare.prepare_all(str(ROOT / OLD), [setting], [], tmp_path / "runs")


def test_a_misspelt_flag_the_kv_estimate_reads_is_refused_for_any_image(tmp_path):
    """`max-num-seq` on a 0.20 image: the engine may take it as --max-num-seqs (argparse's
    prefixes) while the estimate would read no cap; the dry-run names the flag meant."""
    msg = refusal(tmp_path, OLD, "decode.args.max-num-seq=64")
    assert "decode.args.max-num-seq" in msg and "did you mean 'max-num-seqs'" in msg, msg
    msg = refusal(tmp_path, OLD, "decode.args.gpu-memory-utilisation=0.8")
    assert "did you mean 'gpu-memory-utilization'" in msg, msg


def test_the_cli_says_it_in_one_line_without_a_traceback(tmp_path):
    code, out = launcher(tmp_path, "submit", str(ROOT / OLD), "--dry-run",
                         "--set", "decode.args.max-num-seqs=lots")
    assert code == 2, out
    assert "ValueError" not in out and "Traceback" not in out
    assert "error: decode.args.max-num-seqs must be a whole number of 1 or more (got 'lots')" in out, out


@pytest.mark.parametrize("recipe", [OLD, SEED])
def test_a_dynamo_option_in_our_recipe_is_refused_at_dry_run(tmp_path, recipe):
    msg = refusal(tmp_path, recipe, "decode.args.dyn-tool-call-parser=minimax_m2")
    assert msg.startswith("decode.args.dyn-tool-call-parser is an option of Dynamo"), msg
    assert "not of `vllm serve`" in msg and "remove it" in msg, msg


def test_the_srt_slurm_import_keeps_dynamo_options_off_vllm_serve(tmp_path):
    src = srt_slurm.BUNDLED / "recipes/multi-node/MiniMax-M2.5/GB200/8k1k/disagg-gb200-1p1d-tp4.yaml"
    data = yaml.safe_load(src.read_text())
    for mode in ("prefill", "decode"):
        data["backend"]["vllm_config"][mode]["dyn-tool-call-parser"] = "minimax_m2"
        data["backend"]["vllm_config"][mode]["dyn_reasoning_parser"] = "minimax_m2"
    f = tmp_path / "m3.yaml"
    f.write_text(yaml.safe_dump(data))
    out, report = srt_slurm.import_file(f, {"minimax-m2.5-fp8": "MiniMaxAI/MiniMax-M2.5"})
    args = [out.get("vllm_args") or {}] + [(out.get(p) or {}).get("args") or {}
                                           for p in ("prefill", "decode")]
    assert not any(k.startswith(("dyn-", "dyn_")) for a in args for k in a), args
    dev = dict(report.deviations)
    for mode in ("prefill", "decode"):
        for flag in ("dyn-tool-call-parser", "dyn-reasoning-parser"):
            why = dev[f"backend.vllm_config.{mode}.{flag}"]
            assert "Dynamo's frontend" in why, why
    # and the recipe it wrote plans: nothing of Dynamo's reaches vllm serve
    mine = tmp_path / "mine.yaml"
    mine.write_text(srt_slurm.render(out, report))
    [run] = prepare.prepare_all(str(mine), [], [], tmp_path / "runs")
    assert "dyn-" not in (run.run.path / "commands.sh").read_text()
