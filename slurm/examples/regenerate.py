"""Regenerate the golden dry-run examples: `python slurm/examples/regenerate.py`.

For every shipped recipe this writes what `python -m launcher submit NAME --dry-run` emits
(job.sbatch, commands.sh, plan.json and the printed plan) into slurm/examples/NAME/, with the
machine-specific parts (run directory, interpreter, run id) replaced by placeholders.
tests/test_dryrun.py (test_golden_examples_are_current) fails when these files are stale; review the diff, then commit.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("job.sbatch", "commands.sh", "plan.json")


def normalise(text: str, run_dir: Path) -> str:
    text = text.replace(str(run_dir), "<RUN_DIR>")
    text = text.replace(str(run_dir.parent), "<RUNS_DIR>")
    text = text.replace(sys.executable, "<PYTHON>")
    text = text.replace(run_dir.name, "<RUN_ID>")
    # The shared compute environment is named by its pinned versions and the launcher's
    # source by its content: both change with every release, not with the recipe.
    text = re.sub(r"-py(\d+\.\d+)-[0-9a-f]{10}", r"-py\1-<LOCK>", text)
    text = re.sub(r"src-[0-9a-f]{12}", "src-<SOURCE>", text)
    return re.sub(r'"created": [0-9.]+', '"created": 0', text)


def render_all() -> dict[str, dict[str, str]]:
    """{recipe name: {file name: normalised text}} for every shipped recipe."""
    from launcher import text
    from launcher.control import prepare
    from launcher.schema import recipe

    out: dict[str, dict[str, str]] = {}
    shipped = recipe.shipped()
    runs = {name: (path, []) for name, path in shipped.items()}
    runs.update({name: (shipped[base], sets) for name, (base, sets) in VARIANTS.items()})
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, sets) in runs.items():
            # the CLI's own entry point: `submit NAME --dry-run` plans through prepare_all
            [p] = prepare.prepare_all(str(path), sets, [], Path(tmp))
            files = {"dry-run.txt": text.plan_text(p) + "\n"}
            for f in FILES:
                src = p.run.path / f
                if src.exists():
                    files[f] = src.read_text()
            # The shipped sim recipes point at this checkout's sample data.
            root = str(Path(__file__).resolve().parents[2])
            out[name] = {
                f: normalise(t, p.run.path).replace(root, "<REPO>") for f, t in files.items()
            }
        for name, (source, sets, aliases) in IMPORTED.items():
            [p] = prepare.prepare_all(str(source), sets, [], Path(tmp), aliases=aliases)
            files = {"dry-run.txt": text.plan_text(p) + "\n"}
            for f in FILES:
                if (p.run.path / f).exists():
                    files[f] = (p.run.path / f).read_text()
            root = str(Path(__file__).resolve().parents[2])
            out[name] = {
                f: normalise(t, p.run.path).replace(root, "<REPO>") for f, t in files.items()
            }
        out[STUDY] = render_study(Path(tmp) / "study")
    return out


# Published srt-slurm recipes that are not shipped as ours, dry-run as a user brings them:
# InferenceX's agentic DeepSeek-V4-Pro P/D recipe (benchmark.agentic, docs/agentic.md), its
# model alias given as --alias gives it and its nightly image's vLLM named (0.33's parser
# refuses one key of its attention-config).
IMPORTED = {
    "dsv4-gb200-agentx-1p1d-dep8-dep8-mtp": (
        HERE.parents[1] / "launcher" / "data" / "srt-slurm-recipes" / "InferenceX" / "benchmarks"
        / "multi_node" / "srt-slurm-recipes" / "dsv4" / "vllm" / "gb200-fp4" / "agentx"
        / "disagg-1p1d-dep8-dep8-mtp.yaml",
        ["engine_version='0.34'"], {"deepseek-v4-pro": "deepseek-ai/DeepSeek-V4-Pro"}),
}


# Shipped recipes with --set: the other decode front layout of the seed, and the dev
# cluster's recipe on a site profile (extra srun options, a step preamble, no GPU request).
VARIANTS = {
    "qwen3.5-397b-gb200-disagg-one-front": ("qwen3.5-397b-gb200-disagg", ["decode.fronts=one"]),
    "devcluster-sim-site": ("devcluster-sim", [
        f"cluster={HERE.parent / 'devcluster' / 'site-profile.yaml'}", "decode.fronts=per_node",
        "decode.srun_options=[--comment=decode-steps]"]),
}

# The published five configurations as one study in one allocation: its job.sbatch, the
# order and turns of study.json and the dry-run's two ways side by side.
STUDY = "qwen3.5-397b-gb200-disagg-study"


def render_study(tmp: Path) -> dict[str, str]:
    import json

    from launcher import text
    from launcher.control import prepare
    from launcher.schema import recipe

    runs = prepare.prepare_all(str(recipe.shipped()["qwen3.5-397b-gb200-disagg"]), [],
                               ["prefill.endpoints=4,5,6,7,8"], tmp, allocation="one")
    study = runs[0].shared.path
    doc = json.loads((study / "study.json").read_text())
    files = {"dry-run.txt": text.study_plan_text(runs) + "\n",
             "job.sbatch": (study / "job.sbatch").read_text(),
             "study.json": json.dumps(doc, indent=2) + "\n"}
    out = {}
    for f, t in files.items():
        t = t.replace(str(study), "<STUDY_DIR>").replace(str(tmp), "<RUNS_DIR>")
        t = t.replace(sys.executable, "<PYTHON>")
        t = re.sub(r"\b\d{8}-\d{6}-", "<TIME>-", t)
        t = re.sub(r"-py(\d+\.\d+)-[0-9a-f]{10}", r"-py\1-<LOCK>", t)
        out[f] = re.sub(r"src-[0-9a-f]{12}", "src-<SOURCE>", t)
    return out


def main() -> None:
    for name, files in render_all().items():
        folder = HERE / name
        folder.mkdir(exist_ok=True)
        for stale in folder.iterdir():
            if stale.name not in files:
                stale.unlink()
        for f, text in files.items():
            (folder / f).write_text(text)
        print(f"wrote {folder.relative_to(HERE.parent.parent)}/ ({', '.join(sorted(files))})")


if __name__ == "__main__":
    main()
