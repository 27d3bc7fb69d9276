"""AIPerf's own settings (AIPERF_* environment variables) in benchmark.agentic.env: only the
names AIPerf 0.13.0 reads, checked against the installed AIPerf; InferenceX's recipes that
set one import with it, and the AIPerf process gets it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from launcher.control import prepare
from launcher.errors import UserError
from launcher.schema import sections, srt_slurm, srt_slurm_v2

AIPERF = Path(os.environ.get("PD_AIPERF", "/var/tmp/pd-aiperf/venv/bin/aiperf"))
STORE_AGENTIC = (srt_slurm.BUNDLED / "InferenceX/benchmarks/multi_node/srt-slurm-recipes/vllm/"
                 "deepseek-v4/agentic/disagg-gb200-1p1d-dep8-dep8-c128-mtp2-agentic.yaml")
AGENTX = (srt_slurm.BUNDLED / "InferenceX/benchmarks/multi_node/srt-slurm-recipes/dsv4/vllm/"
          "gb200-fp4/agentx/disagg-1p1d-dep8-dep8-mtp.yaml")
ALIAS = {"deepseek-v4-pro": "deepseek-ai/DeepSeek-V4-Pro"}


def test_the_list_is_what_the_installed_aiperf_reads():
    python = AIPERF.parent / "python"
    if not python.exists():
        pytest.fail(f"aiperf 0.13.0 is not installed at {AIPERF}: run `bash tests/aiperf/setup.sh`")
    out = subprocess.run([str(python), "-c", (
        "from importlib.metadata import version; from aiperf.common import environment as e\n"
        "print(version('aiperf'))\n"
        "for f in e._Environment.model_fields.values():\n"
        "    c = f.annotation\n"
        "    for n in c.model_fields: print(c.model_config.get('env_prefix', '') + n)")],
        capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "0.13.0", out[0]
    assert set(out[1:]) == sections.aiperf_env_names()
    assert "AIPERF_DATASET_MMAP_CACHE_ENABLED" in out


def test_the_published_store_recipe_imports_with_its_aiperf_setting():
    recipe, report = srt_slurm.import_file(STORE_AGENTIC, ALIAS)
    ag = recipe["benchmark"]["agentic"]
    assert ag["env"] == {"AIPERF_DATASET_MMAP_CACHE_ENABLED": "false"}
    assert ag["trace"] == "semianalysis_cc_traces_weka_062126"
    assert recipe["kv_store"]["store_config"]["global_segment_size"] == "140GB"
    assert "benchmark.agentic.env.AIPERF_DATASET_MMAP_CACHE_ENABLED" in \
        dict(report.mapped)["benchmark.env.AIPERF_DATASET_MMAP_CACHE_ENABLED"]


def test_a_name_aiperf_does_not_read_is_one_sentence_with_the_one_meant(tmp_path):
    data = yaml.safe_load(AGENTX.read_text())
    data = srt_slurm_v2.deep_merge(data, {"benchmark": {"env": {
        "AIPERF_DATASET_MMAP_CACHE_ENABLE": "false"}}})
    with pytest.raises(UserError) as e:  # a typo of AIPerf's name is InferenceX's script's?
        srt_slurm.convert(data, "x.yaml", "0" * 64, ALIAS)
    assert "AIPERF_DATASET_MMAP_CACHE_ENABLE is read by InferenceX's script" in str(e.value)
    recipe, _ = srt_slurm.convert(yaml.safe_load(AGENTX.read_text()), "x.yaml", "0" * 64, ALIAS)
    recipe["benchmark"]["agentic"]["env"] = {"AIPERF_DATASET_MMAP_CACHE_ENABLE": False}
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump(recipe))
    with pytest.raises(UserError) as e:
        prepare.prepare_all(str(f), [], [], tmp_path / "runs")
    text = " ".join(str(e.value).split())
    assert ("AIPERF_DATASET_MMAP_CACHE_ENABLE is not a setting AIPerf 0.13.0 reads; did you "
            "mean 'AIPERF_DATASET_MMAP_CACHE_ENABLED'?") in text, text
    assert text.count("\n") == 0 and "Traceback" not in text


def test_the_aiperf_process_gets_its_settings(tmp_path):
    recipe, _ = srt_slurm.convert(yaml.safe_load(AGENTX.read_text()), "x.yaml", "0" * 64, ALIAS)
    recipe["benchmark"]["agentic"]["env"] = {"AIPERF_DATASET_MMAP_CACHE_ENABLED": False}
    recipe["engine_version"] = "0.34"
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump(recipe))
    (p,) = prepare.prepare_all(str(f), [], [], tmp_path / "runs")
    bench = [x for x in p.rendered.processes if x.name.startswith("bench-c")]
    assert bench and all(x.env["AIPERF_DATASET_MMAP_CACHE_ENABLED"] == "0" for x in bench)
