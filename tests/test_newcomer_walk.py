"""What a newcomer meets on the command line: several problems a line each, advice that can
be followed literally, a recipe list that fits a screen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from helpers import launcher

from launcher.schema import srt_slurm

ROOT = Path(__file__).resolve().parents[1]
MINIMAX = srt_slurm.BUNDLED / "recipes/multi-node/MiniMax-M2.5/GB200/8k1k/disagg-gb200-1p1d-tp4.yaml"


def cli(tmp_path: Path, *args: str) -> tuple[int, str]:
    """`python -m launcher ARGS` (no --runs-dir: not every command takes one)."""
    p = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    return p.returncode, p.stdout + p.stderr


def broken_srt(tmp_path: Path) -> Path:
    d = yaml.safe_load(MINIMAX.read_text())
    d["profiling"] = {"type": "nsys"}
    d["bogus"] = 1
    d["backend"]["vllm_config"]["decode"]["headless"] = True
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


def test_several_problems_are_printed_a_line_each(tmp_path):
    f = broken_srt(tmp_path)
    for args in (("recipes", "import", str(f), "-o", str(tmp_path / "o.yaml")),
                 ("submit", str(f), "--dry-run", "--runs-dir", str(tmp_path / "runs"))):
        code, out = cli(tmp_path, *args)
        assert code == 2, out
        assert "\\n" not in out, out
        lines = out.strip().splitlines()
        assert lines[0] == f"error: cannot import {f} (srt-slurm recipe): 4 problems:", out
        assert any(x.startswith("  - profiling: ") for x in lines), out
        assert any(x.startswith("  - bogus is not a key") for x in lines), out
        assert any(x.startswith("  - backend.vllm_config.decode.headless: ") for x in lines), out
    # several engine-flag problems of our own recipe: a line each too
    code, out = launcher(tmp_path, "submit", "qwen3.5-397b-gb200-disagg", "--dry-run",
                         "--set", "decode.args.max-num-seqs=lots",
                         "--set", "prefill.args.gpu-memory-utilization=2")
    assert code == 2 and "\\n" not in out, out
    lines = out.strip().splitlines()
    assert lines[0] == "error: the recipe's engine flags: 2 problems:", out
    assert lines[1].startswith("  - decode.args.max-num-seqs must be") or \
        lines[2].startswith("  - decode.args.max-num-seqs must be"), out


def aliased_srt(tmp_path: Path, repo: str | None) -> Path:
    d = yaml.safe_load(MINIMAX.read_text())
    assert d["model"]["path"] == "minimax-m2.5-fp8"  # an alias only a site's srtslurm.yaml knows
    if repo:
        d["identity"] = {"model": {"repo": repo}}
    f = tmp_path / ("with-repo.yaml" if repo else "alias.yaml")
    f.write_text(yaml.safe_dump(d))
    return f


def test_the_alias_advice_of_submit_works_as_written(tmp_path):
    """`submit FILE` says "give --alias NAME=..." for a model alias: submit takes --alias, and
    where the file names its checkpoint (identity.model.repo) that is the value offered."""
    import re

    f = aliased_srt(tmp_path, "MiniMaxAI/MiniMax-M2.5")
    code, out = cli(tmp_path, "submit", str(f), "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert code == 2, out
    m = re.search(r"give (--alias \S+)", out)
    assert m and m.group(1) == "--alias minimax-m2.5-fp8=MiniMaxAI/MiniMax-M2.5", out
    assert "identity.model.repo" in out, out
    code, out = cli(tmp_path, "submit", str(f), "--dry-run", "--runs-dir",
                    str(tmp_path / "runs"), *m.group(1).split(" ", 1))
    assert code == 0, out
    assert "model.path: MiniMaxAI/MiniMax-M2.5" in (next((tmp_path / "runs").glob("*/recipe.yaml"))
                                                     .read_text()).replace("'", "") or \
        "MiniMaxAI/MiniMax-M2.5" in out, out
    # without identity.model.repo: the placeholder, and the same option works for submit
    g = aliased_srt(tmp_path, None)
    code, out = cli(tmp_path, "submit", str(g), "--dry-run", "--runs-dir", str(tmp_path / "r2"))
    assert code == 2 and "give --alias minimax-m2.5-fp8=HF_ID_OR_FOLDER" in out, out
    code, out = cli(tmp_path, "submit", str(g), "--dry-run", "--runs-dir", str(tmp_path / "r2"),
                    "--alias", "minimax-m2.5-fp8=MiniMaxAI/MiniMax-M2.5")
    assert code == 0, out


def test_the_port_conflict_advice_works_when_followed_literally(tmp_path):
    """Ports taken on this host: the refusal names the profile file to copy and the
    port_base to set in it, and how to point the run at the copy; doing just that runs."""
    import re

    from helpers import free_port_base, profile_copy

    # two blocks of this test's own, and the block past them the advice moves the run to
    base = free_port_base(range(27000, 30000, 500), 2400)
    prof = profile_copy(tmp_path / "mine.yaml", "local", port_base=base, port_blocks=2)
    # the router's port of every block the run could move to (as another local run's would
    # be): refused, with the advice
    from launcher.planning import plan
    from launcher.schema import cluster, recipe

    span = plan.make_plan(recipe.load("local-sim"), cluster.load(prof),
                          ["local-1", "local-2", "local-3"]).port_span
    slots, block = plan.job_port_slots(cluster.load(prof), span)
    import contextlib

    from helpers import listening

    held = contextlib.ExitStack()
    held.enter_context(listening(range(base, base + slots * block, block)))
    code, out = launcher(tmp_path, "submit", "local-sim", "--set", f"cluster={prof}",
                         "--set", "benchmark.concurrency=[4]")
    try:
        assert code == 2 and "ports in use on this host" in out, out
        m = re.search(r"copy (\S+), set port_base: (\d+) in the copy and add "
                      r"--set cluster=COPY\.yaml", out)
        assert m, out
        src, new = Path(m.group(1)), int(m.group(2))
        assert src == Path(prof) and new != base, out
        copy = tmp_path / "COPY.yaml"
        copy.write_text(re.sub(r'"port_base": \d+', f'"port_base": {new}', src.read_text()))
        code, out = launcher(tmp_path, "submit", "local-sim", "--set", "cluster=COPY.yaml",
                             "--set", "benchmark.concurrency=[4]")
        assert code == 0, out
    finally:
        held.close()


def test_status_of_a_dry_run_with_a_blocker_names_its_fix_not_submit(tmp_path):
    code, out = launcher(tmp_path, "submit", "qwen3.5-397b-gb200-disagg", "--dry-run")
    assert code == 0 and "blocker: submit will refuse this run" in out, out
    code, out = launcher(tmp_path, "status")
    assert code == 0, out
    last = out.strip().splitlines()[-1]
    assert not last.startswith("next: submit it"), last
    assert last.startswith("next: mend the blocker first: ") and "stage-model" in last, last
    assert "submit refuses it until then" in last, last
    # a dry-run with no blocker still says to submit it
    code, out = launcher(tmp_path, "submit", "local-sim", "--dry-run")
    assert code == 0, out
    code, out = launcher(tmp_path, "status")
    assert out.strip().splitlines()[-1].startswith("next: submit it"), out


def test_the_demo_kv_line_says_the_memory_its_blocks_take(tmp_path):
    """local-sim sets --num-gpu-blocks-override 384: its cache is 384 blocks of 256 KiB
    (96 MiB), not the 159 GiB the GPU's memory would leave for it."""
    import re

    code, out = launcher(tmp_path, "submit", "local-sim", "--dry-run")
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("KV capacity decode-0"))
    block = re.search(r"a block is a page in each of .*?\((\d+) KiB\): (\d+) blocks/rank", out)
    assert block, out
    size_mib = int(block.group(1)) * int(block.group(2)) / 1024
    assert f"{size_mib:.0f} MiB/GPU" in line, line
    assert "--num-gpu-blocks-override" in line and "GiB/GPU (weights" not in line, line


def test_the_seed_kv_warning_points_to_the_section_on_the_published_5120(tmp_path):
    code, out = launcher(tmp_path, "submit", "qwen3.5-397b-gb200-disagg", "--dry-run")
    assert code == 0, out
    warning = next(x for x in out.splitlines()
                   if x.startswith("warning: the sweep's top concurrency 5,120 exceeds"))
    assert "docs/kv-capacity.md section 11" in warning, warning
    assert "not a measured capacity" in warning, warning
    doc = (ROOT / "docs" / "kv-capacity.md").read_text()
    section = doc.split("## 11. ", 1)[1].split("\n## ", 1)[0]
    assert "not a measured capacity" in section and "top concurrency" in section


def test_recipes_is_a_short_table_and_show_has_the_detail(tmp_path):
    from launcher.schema import recipe as rmod

    code, out = cli(tmp_path, "recipes")
    assert code == 0, out
    lines = out.strip().splitlines()
    assert lines[0].split() == ["RECIPE", "MODEL", "SHAPE", "CLUSTER", "ENGINE"], lines[0]
    names = list(rmod.shipped())
    assert [x.split()[0] for x in lines[1:1 + len(names)]] == names, out
    assert all(len(x) <= 150 for x in lines), max(lines, key=len)
    assert len(out) < 6000, len(out)
    assert "recipes show NAME" in lines[-1], lines[-1]
    seed = next(x for x in lines if x.startswith("qwen3.5-397b-gb200-disagg "))
    assert "nvidia/Qwen3.5-397B-A17B-NVFP4" in seed and "4 x DEP2 : 1 x DEP8" in seed, seed
    code, shown = cli(tmp_path, "recipes", "show", "qwen3.5-397b-gb200-disagg")
    assert code == 0 and "description:" in shown, shown


def test_the_newest_of_two_runs_made_in_one_second_is_the_one_made_last(tmp_path):
    """A run's id starts with its second: `status` after two dry-runs in one second (the
    second one's name sorting first) shows the second, not the one whose name sorts last."""
    import os

    from launcher.control import runs as runs_mod

    for i, name in enumerate(("20261206-153922-qwen3.5-397b", "20261206-153922-local-sim")):
        run = tmp_path / name
        run.mkdir()
        (run / "recipe.yaml").write_text("name: x\n")
        os.utime(run / "recipe.yaml", ns=(1_000_000_000 + i, 1_000_000_000 + i))
    assert runs_mod.find(tmp_path, None).run_id == "20261206-153922-local-sim"
