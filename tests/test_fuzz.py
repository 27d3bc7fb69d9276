"""Property-based fuzzing of `submit --dry-run` (issue 13): recipes, --set, --sweep,
--nodelist and --runs-dir, driven through the real CLI entry point in-process.

Every case either
- is accepted (exit 0): then commands.sh and job.sbatch pass `bash -n`, every #SBATCH line is
  one sbatch option as sbatch itself splits it, and both scripts, run by bash with a stub in
  front of every command line and nothing else on PATH, hand each program exactly the words
  plan.json (the renderer's truth) says, one argument per value, running nothing injected; or
- is rejected: exit 2, stdout empty, stderr exactly one line "error: ..." that names the
  field or flag to fix (problems found together: that line ends "N problems:" and a line
  "  - ..." each follows).
Never a traceback, never more than 5 s, and no secret value in any written file or stdout.

"One argument" is checked by execution, not by reading: every non-comment line of a script
gets a recorder (`pd-exec`, a bash script) put in front of it, PATH holds only that recorder,
and bash runs the script. The recorder writes the words bash handed it, NUL-separated, to a
file; the test compares them with the process's `env K=V ... argv` from plan.json. Injected
code (`$(...)`, backticks, `;`, quotes) would either change those words, print "command not
found" (nothing else is on PATH), or write a marker file with shell builtins only: each of
those fails the case.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher import cli
from launcher.planning import render
from launcher.schema import recipe as recipe_mod

REPO = Path(__file__).resolve().parents[1]
RECIPES = {p.stem: p for p in sorted((REPO / "launcher" / "recipes").glob("*.yaml"))}
CLUSTERS = {p.stem: p for p in sorted((REPO / "launcher" / "clusters").glob("*.yaml"))}
DATA = REPO / "launcher" / "data"
CASE_LIMIT_S = 5.0
MIN_CASES = 500

# Secret values: in the environment (travel by name only) and put into flags and knobs (must
# be refused). None may appear in any written file or on stdout.
ENV_SECRETS = {
    "HF_TOKEN": "hf_FUZZenvSECRET0001",
    "VLLM_API_KEY": "sk-FUZZenvSECRET0002",
    "AWS_SECRET_ACCESS_KEY": "FUZZenvSECRET0003",
}
FLAG_SECRET = "sk-FUZZflagSECRET0004"
SECRETS = [*ENV_SECRETS.values(), FLAG_SECRET]
SECRET_PATHS = [
    "vllm_args.api-key", "vllm_args.hf-token", "vllm_args.--api-key", "router.args.api-key",
    "prefill.args.hf_token", "decode.args.api-key", "agg.args.secret-key", "env.HF_TOKEN",
    "env.MY_PASSWORD", "decode.env.AWS_SECRET_ACCESS_KEY", "env.SIM_API_KEY", "sim.api_token",
    "sim.hf_token", "prefill.env.SIM_TOKEN",
]  # fmt: skip

MARKER = Path(tempfile.gettempdir()) / f"pwned-{uuid.uuid4().hex}"
# Injection attempts use shell builtins only (PATH holds nothing else while scripts run).
_PWN = f"echo pwned >> {MARKER}"
HOSTILE = [
    f"$({_PWN})", f"`{_PWN}`", f"; {_PWN}", f"' ; {_PWN} ; '", f'" ; {_PWN} ; "',
    f"x && {_PWN}", f"x | {_PWN} #", f"$(printf pwned >> {MARKER})", "${IFS}x", "$HOME",
    "a b", "it's", 'say "hi"', "tab\there", "x;y&z|w", "# not a comment", "-x", "--help",
    "--jobid=$SLURM_JOB_ID", "'--jobid=$SLURM_JOB_ID'", "a\\b", "back\\", "100%j", "%x",
    "a:b", "a,b", "a:b,c:d", "hetjob", "packJob", "é€😀", "\u2028", "\x85", "\u00a0",
    "\udcff", "\ud800", "", " ", "~", "*", "?", "[a]", "{a,b}", "!!", "&", "<x", ">x",
    "line1\nline2", "cr\rx", "nul\x00x", "esc\x1b[31m", "\x7f", f"a\n{_PWN}",
    f"x\n#SBATCH --wrap={_PWN}", "x" * 300, "y" * 5000,
]  # fmt: skip
HUGE = [10**7, 10**9, 2**31, 2**63 - 1, 10**18, -(10**18), 10**30, 10**400]

SWEEPABLE = [
    "prefill.endpoints", "decode.endpoints", "decode.data_parallel", "prefill.data_parallel",
    "agg.endpoints", "prefill.tensor_parallel", "benchmark.input_len", "name",
    "model.served_name", "slurm.directives.comment", "env.FOO", "vllm_args.max-num-seqs",
    "health.timeout_s", "accuracy.threshold", "slurm.partition", "telemetry.interval_s",
]  # fmt: skip
EXTRA_PATHS = [
    "slurm.directives.comment", "slurm.directives.mail-user", "slurm.directives.exclusive",
    "slurm.directives.constraint", "slurm.directives.t", "slurm.directives.part",
    "slurm.directives.tim", "slurm.directives.out", "slurm.directives.N",
    "slurm.directives.gpus-per-node", "slurm.directives.--reservation",
    "slurm.directives.no-req", "vllm_args.max-num-seqs", "vllm_args.served-model-name",
    "prefill.args.block-size", "decode.args.block-size", "router.args.policy",
    "router.policy", "env.FOO", "env.LD_PRELOAD", "decode.env.BAR", "env_from_host",
    "kv_connector.kv_connector_extra_config.backends", "kv_connector.x", "container.image",
    "container.mounts", "container.workdir", "model.path", "model.served_name",
    "model.revision", "model.facts.weight_bits", "model.facts.total_params_b",
    "model.facts.max_position_embeddings", "model.facts.full_attention_layers",
    "model.facts.head_dim", "model.facts.num_kv_heads", "model.facts.gdn_layers",
    "accuracy.data", "accuracy.train", "accuracy.num_questions", "benchmark.concurrency",
    "benchmark.prompts_per_point", "sim.speed", "sim.kv_capacity_tokens", "sim.ucx_transport",
    "sim.crash_after_s", "engine", "mode", "cluster", "name", "hold_s", "slurm.time_limit",
    "slurm.signal_lead_s", "engine_version", "agg.endpoints", "agg.data_parallel",
    "prefill.gpus_per_node", "decode.gpus_per_node", "decode.api_servers",
    "prefill.expert_parallel", "kv_store.store_config.metadata_server",
    "kv_store.store_config.global_segment_size", "kv_store.store_config.mode",
    "kv_store.master_args", "kv_store.master_command", "kv_store.lease_ttl_ms",
    "kv_store.env.MC_X", "prefill.kv_connector.kv_connector", "decode.kv_connector.kv_role",
    "agg.kv_connector.kv_connector_extra_config.connectors",
]  # fmt: skip
CLUSTER_PATHS = [
    "name", "scheduler", "gpus_per_node", "gpu_memory_gib", "port_base", "dry_run_nodes",
    "bind_host", "env.NCCL_X", "env.-i", "env.A B", "env.X=Y", "compute_env.mode",
    "compute_env.python", "compute_env.dir", "compute_env.python_version",
    "containers.runtime", "containers.mounts", "containers.writable",
    "containers.image_cache", "network.interface", "models.hf_home", "models.internet",
    "nodes_per_rack", "gres_type", "gpu_directive", "segment", "mem_zero", "nofile",
    "kill_wait_s", "arch", "gpu_kind", "prometheus_sd_dir", "exclusive", "host_memory_gib",
]  # fmt: skip

# Free-text fields: any string is valid there, so hostile text reaches the scripts.
TEXT_PATHS = [
    "env.FOO", "decode.env.BAR", "prefill.env.BAZ", "vllm_args.some-flag", "prefill.args.x",
    "router.args.y", "router.policy", "model.served_name", "model.path", "model.revision",
    "slurm.directives.comment", "slurm.directives.mail-user", "description", "accuracy.data",
    "accuracy.train", "container.workdir", "kv_connector.kv_connector_extra_config.x",
    "sim.ucx_transport", "slurm.directives.constraint",
]  # fmt: skip
STATS = {"cases": 0, "accepted": 0, "rejected": 0, "slowest": 0.0, "seconds": 0.0}
PROPERTIES_RUN: set[str] = set()
LAST: dict = {}  # the case being run (for reports)


# --- strategies ------------------------------------------------------------------------------

texts = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from("\n\r\x00\t\x1b"),
    max_size=40,
)
hostile = st.sampled_from(HOSTILE) | texts
numbers = st.one_of(
    st.integers(-5, 70), st.sampled_from(HUGE), st.integers(-(10**18), 10**18),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, -1.5, 1e308, 1e-308]),
)  # fmt: skip
dates = st.sampled_from(["2024-01-01", "2024-01-01T10:00:00Z", "2001-12-14 21:59:43.10 -5"])
scalars = st.one_of(numbers, hostile, st.booleans(), st.none(), dates)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile | st.sampled_from(["a", "b"]), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


def _yaml_text(value) -> str:
    """A value as YAML flow text (what a user would type after `=`)."""
    try:
        return (
            yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 20)
            .strip()
            .removesuffix("\n...")
            .removesuffix("...")
            .strip()
        )
    except Exception:
        return str(value)


override_values = st.one_of(values.map(_yaml_text), hostile, dates)

ALIAS_BOMB = "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: &d [*c, *c]\ne: [*d, *d]\n"
WHOLE_TEXTS = [
    ALIAS_BOMB, "- a\n- b\n", "just a string\n", "", "~\n", "42\n", "---\na: 1\n---\nb: 2\n",
    "[" * 400 + "]" * 400, "{a: " * 300 + "1" + "}" * 300, "a: [" + "1," * 40000 + "1]\n",
    "k: v\n" * 30000, "name: !!python/object/apply:os.system ['" + _PWN + "']\n",
    "a: [" + "1," * 20000 + "1]\n", "".join(f"k{i}: 1\n" for i in range(6000)),
    "\t- bad indentation", "a: 'unclosed\n", "a: b: c\n", "%YAML 9.9\n---\na: 1\n",
]  # fmt: skip
TAG_INSERTS = [
    "kv_connector: {when: !!timestamp 2024-01-01}\n", "kv_connector: {b: !!binary aGVsbG8=}\n",
    "kv_connector: {s: !!set {a, b}}\n", "kv_connector: {o: !!omap [{a: 1}]}\n",
    "kv_connector: {x: .inf, y: .nan}\n", "description: &anchor text\n",
    "env: {X: !!str 1}\n", "kv_connector: {big: " + "9" * 5000 + "}\n",
    "kv_connector: {deep: " + "[" * 60 + "]" * 60 + "}\n", "kv_connector: {1: a, null: b}\n",
    "kv_connector: {x: 1.0e+400}\n", "vllm_args: {x: !!float nan}\n", "name: !foo bar\n",
    "<<: {name: merged}\n",
]  # fmt: skip


@st.composite
def yaml_file(draw, base: dict, paths: list[str]) -> dict:
    """A mutated YAML file: {"kind": "text" | "bytes", "content", "touched": the keys changed}."""
    data = json.loads(json.dumps(base))
    touched = []
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["set", "set", "del", "huge", "hostile", "text", "text", "text"]))
        if op == "text" and paths is EXTRA_PATHS:
            path = draw(st.sampled_from(TEXT_PATHS))
        else:
            path = draw(st.sampled_from(paths) | st.sampled_from(sorted(_leaf_paths(base))))
        touched.append(path)
        if op == "del":
            _delete(data, path.split("."))
        else:
            strategy = {"set": values, "huge": st.sampled_from(HUGE)}.get(op, hostile)
            _set(data, path.split("."), draw(strategy))
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=draw(st.booleans()))
    kind = draw(
        st.sampled_from(
            ["text"] * 8 + ["whole", "tag", "tag", "dup", "truncate", "nul", "binary", "big"]
        )
    )
    if kind == "whole":
        text = draw(st.sampled_from(WHOLE_TEXTS))
    elif kind == "tag":
        insert = draw(st.sampled_from(TAG_INSERTS))
        text += insert
        touched.append(insert.split(":")[0])
    elif kind == "dup":
        insert = draw(st.sampled_from(["name: dup\n", "cluster: local\n", "mode: agg\n"]))
        text += insert
        touched.append(insert.split(":")[0])
    elif kind == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif kind == "nul":
        i = draw(st.integers(0, len(text)))
        text = text[:i] + "\x00" + text[i:]
    elif kind == "binary":
        return {
            "kind": "bytes",
            "content": draw(st.binary(min_size=1, max_size=200)),
            "touched": touched,
        }
    elif kind == "big":
        text += "# " + "x" * (1 << 20) + "\n"
    return {"kind": "text", "content": text, "touched": touched}


def _leaf_paths(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        p = f"{prefix}{k}"
        out.add(p)
        if isinstance(v, dict):
            out |= _leaf_paths(v, p + ".")
    return out


def _set(d: dict, path: list[str], v) -> None:
    for part in path[:-1]:
        if not isinstance(d.get(part), dict):
            d[part] = {}
        d = d[part]
    d[path[-1]] = v


def _delete(d: dict, path: list[str]) -> None:
    for part in path[:-1]:
        d = d.get(part)
        if not isinstance(d, dict):
            return
    d.pop(path[-1], None)


def _base(name: str) -> dict:
    data = yaml.safe_load(RECIPES[name].read_text())
    acc = data.get("accuracy") or {}
    for key in ("data", "train"):  # the shipped ones are relative to the recipe file
        if isinstance(acc.get(key), str) and acc[key].startswith(".."):
            acc[key] = str(DATA / Path(acc[key]).name)
    return data


BASES = {name: _base(name) for name in RECIPES}
CLUSTER_BASES = {name: yaml.safe_load(p.read_text()) for name, p in CLUSTERS.items()}
SPECIAL_FILES = ["missing", "dir", "dir.yaml", "unreadable", "fifo", "symlink-loop"]


@st.composite
def recipe_source(draw) -> dict:
    """The recipe: a shipped name, or a (mutated) file, with its cluster profile."""
    name = draw(st.sampled_from(sorted(RECIPES)))
    form = draw(st.sampled_from(["name"] * 2 + ["file"] * 8 + ["special"]))
    if form == "name":
        return {"form": "name", "name": name, "touched": []}
    if form == "special":
        return {"form": "special", "special": draw(st.sampled_from(SPECIAL_FILES)), "touched": []}
    f = draw(yaml_file(BASES[name], EXTRA_PATHS))
    src = {"form": "file", "name": name, "file": f, "touched": list(f["touched"])}
    which = draw(st.sampled_from(["keep"] * 6 + ["mutated", "special"]))
    if which == "mutated":
        cname = BASES[name]["cluster"]
        src["cluster"] = draw(yaml_file(CLUSTER_BASES[cname], CLUSTER_PATHS))
        src["touched"] += ["cluster"] + src["cluster"]["touched"]
    elif which == "special":
        src["cluster_special"] = draw(st.sampled_from(SPECIAL_FILES))
        src["touched"].append("cluster")
    if draw(st.integers(0, 9)) == 0:  # a secret in a flag or knob: must be refused
        path = draw(st.sampled_from(SECRET_PATHS))
        src["secret_in_file"] = path
    return src


set_keys = st.sampled_from(EXTRA_PATHS + SWEEPABLE) | texts.filter(lambda s: "=" not in s)
set_specs = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", set_keys, override_values),
    # a hostile string as a YAML double-quoted scalar (JSON's escapes are YAML's) in a field
    # that takes any text: these reach the scripts
    st.builds(lambda k, v: f"{k}={json.dumps(v)}", st.sampled_from(TEXT_PATHS), hostile),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(TEXT_PATHS), hostile),
    hostile,
)  # fmt: skip
sweep_values = st.lists(
    st.integers(-3, 12).map(str) | st.sampled_from(["a/b", "a b", "../x", "x/../../y", "1/2", "é", "a:b", "--x", "$(x)", "hetjob", ""]) | hostile.filter(lambda s: "," not in s),
    min_size=0, max_size=5,
)  # fmt: skip
# Axes that usually give valid studies: the values then reach directory names and scripts.
plausible_sweeps = st.one_of(
    st.builds(lambda vs: "prefill.endpoints=" + ",".join(map(str, vs)), st.lists(st.integers(1, 6), min_size=1, max_size=4, unique=True)),
    st.builds(lambda vs: "benchmark.input_len=" + ",".join(map(str, vs)), st.lists(st.integers(1, 10**6), min_size=1, max_size=3, unique=True)),
    st.builds(lambda k, vs: f"{k}=" + ",".join(vs), st.sampled_from(["model.served_name", "env.FOO", "slurm.directives.comment", "vllm_args.x"]),
              st.lists(hostile.filter(lambda s: "," not in s and s.strip()), min_size=1, max_size=3, unique_by=str.strip)),
)  # fmt: skip
sweep_specs = st.one_of(
    plausible_sweeps, plausible_sweeps,
    st.builds(lambda k, vs: f"{k}={','.join(vs)}", st.sampled_from(SWEEPABLE) | texts, sweep_values),
    st.builds(lambda k, n: f"{k}=" + ",".join(str(i) for i in range(n)), st.sampled_from(SWEEPABLE), st.sampled_from([65, 1000, 5000])),
    st.sampled_from(["prefill.endpoints=4,4", "=1,2", "prefill.endpoints", "prefill.endpoints=", ",,,", "a.b.c=1,2,3"]),
    hostile,
)  # fmt: skip
nodelists = st.one_of(
    st.sampled_from([
        "n[001-010]", "gb200-r01-[01-18]", "n[0-99999999]", "n[1-5000]", "n[1-4096]", "a[1-2]b[3-4]",
        "a[", "]", "a,,b", "n[5-1]", "n[01-03,07],login1", "n[1-2,1-2]", "n[-]", "n[a-b]",
        "n[0000000001-0000000009]", ",".join(f"n{i}" for i in range(5000)), "x" * 100000,
        "n1,n1,n1,n1,n1,n1", "-n1", "n1 n2", "N1.example.com", "[1-3]",
    ]),
    hostile,
    st.lists(st.sampled_from(["n1", "n2", "n3", "n4", "n5", "n6", "gb-01", "x"]) | hostile, max_size=8).map(",".join),
)  # fmt: skip
RUNS_DIR_KINDS = [
    "plain",
    "hostile",
    "file",
    "under-file",
    "proc",
    "long",
    "long-component",
    "relative",
]
runs_dirs = st.tuples(st.sampled_from(RUNS_DIR_KINDS), hostile)


@st.composite
def cases(draw, focus: str) -> dict:
    """One CLI invocation. `focus` biases the draw toward one input, the rest stay plausible."""
    case = {"recipe": draw(recipe_source()) if focus == "recipe" else
            {"form": "name", "name": draw(st.sampled_from(sorted(RECIPES))), "touched": []}}  # fmt: skip
    case["sets"] = draw(st.lists(set_specs, max_size=3)) if focus == "set" else []
    if focus == "set" and draw(st.integers(0, 5)) == 0:
        case["sets"].append(f"{draw(st.sampled_from(SECRET_PATHS))}={FLAG_SECRET}")
    case["sweeps"] = draw(st.lists(sweep_specs, min_size=1, max_size=2)) if focus == "sweep" else []
    case["nodelist"] = draw(nodelists) if focus == "nodelist" else None
    case["runs_dir"] = draw(runs_dirs) if focus == "runs_dir" else ("plain", "")
    case["json"] = draw(st.booleans())
    return case


# --- running a case --------------------------------------------------------------------------


class Workspace:
    """Per-session stubs and a scratch folder per case."""

    def __init__(self, root: Path):
        self.root = root
        self.stubs = root / "stubs"
        self.stubs.mkdir()
        rec = self.stubs / "pd-exec"
        # Builtins only: PATH holds nothing but this file while the scripts run.
        rec.write_text(
            "#!/bin/bash\n"
            'f="$PD_REC_DIR/$$.$SRANDOM"\n'
            'for a in "$@"; do printf \'%s\\0\' "$a"; done > "$f"\n'
        )
        rec.chmod(0o755)
        self.n = 0

    def new_case(self) -> Path:
        self.n += 1
        d = self.root / f"c{self.n}"
        d.mkdir()
        return d


def _special(case_dir: Path, kind: str, stem: str) -> Path:
    p = case_dir / f"{stem}.yaml"
    if kind == "missing":
        return p
    if kind in ("dir", "dir.yaml"):
        p = case_dir / (stem if kind == "dir" else f"{stem}.yaml")
        p.mkdir()
        return p
    if kind == "unreadable":  # a regular file whose read fails (root reads any mode bits)
        return Path("/proc/self/mem")
    if kind == "fifo":
        os.mkfifo(p)
        return p
    if kind == "symlink-loop":
        p.symlink_to(p)
        return p
    raise AssertionError(kind)


def _write(p: Path, f: dict) -> None:
    if f["kind"] == "bytes":
        p.write_bytes(f["content"])
    else:
        p.write_text(f["content"], encoding="utf-8", errors="surrogatepass")


def materialize(case: dict, case_dir: Path) -> tuple[list[str], list[str], Path, bool]:
    """argv, the words an error may name to point at the input to fix, the runs root, and
    whether a secret went into a flag or knob."""
    r = case["recipe"]
    hints: list[str] = []
    secret = any(FLAG_SECRET in s for s in case["sets"])
    if r["form"] == "name":
        ref = r["name"]
    elif r["form"] == "special":
        ref = str(_special(case_dir, r["special"], "recipe"))
        hints.append(ref)
    else:
        p = case_dir / "recipe.yaml"
        f = r["file"]
        if f["kind"] == "text" and (
            "cluster" in r or "cluster_special" in r or "secret_in_file" in r
        ):
            try:
                data = yaml.safe_load(f["content"])
            except Exception:
                data = None
            if isinstance(data, dict):
                if "cluster" in r:
                    cp = case_dir / "cluster.yaml"
                    _write(cp, r["cluster"])
                    data["cluster"] = str(cp)
                    hints.append(str(cp))
                elif "cluster_special" in r:
                    data["cluster"] = str(_special(case_dir, r["cluster_special"], "cluster"))
                    hints.append(data["cluster"])
                if "secret_in_file" in r:
                    _set(data, r["secret_in_file"].split("."), FLAG_SECRET)
                    secret = True
                    hints += r["secret_in_file"].split(".")
                f = {"kind": "text", "content": yaml.safe_dump(data, sort_keys=False)}
        _write(p, f)
        ref = str(p)
        hints.append(ref)
    hints += [part for t in r["touched"] for part in [t, *t.split(".")]]
    argv = ["submit", "--dry-run"]
    for s in case["sets"]:
        argv.append(f"--set={s}")
        hints += ["--set", *s.partition("=")[0].split(".")]
    for s in case["sweeps"]:
        argv.append(f"--sweep={s}")
        hints += ["--sweep", *s.partition("=")[0].split(".")]
    if case["nodelist"] is not None:
        argv.append(f"--nodelist={case['nodelist']}")
        hints.append("--nodelist")
    kind, text = case["runs_dir"]
    runs = _runs_dir(case_dir, kind, text)
    if kind != "plain":
        hints.append("--runs-dir")
    argv.append(f"--runs-dir={runs}")
    if case["json"]:
        argv += ["--format", "json"]
    argv += ["--", ref]
    # argv cannot carry NUL bytes: a real command line never holds one
    return [a.replace("\x00", "") for a in argv], hints, Path(str(runs).replace("\x00", "")), secret


def _runs_dir(case_dir: Path, kind: str, text: str) -> Path:
    runs = case_dir / "runs"
    if kind == "plain":
        return runs
    if kind == "hostile":
        return case_dir / f"r{text}" / "runs"
    if kind == "file":
        runs.write_text("not a directory")
        return runs
    if kind == "under-file":
        (case_dir / "f").write_text("x")
        return case_dir / "f" / "runs"
    if kind == "proc":
        return Path("/proc/self/pd-fuzz-runs")
    if kind == "long":
        return case_dir / "/".join(["d" * 200] * 25)
    if kind == "long-component":
        return case_dir / ("d" * 300)
    if kind == "relative":
        return Path(f"rel{text}/runs")
    raise AssertionError(kind)


def run_cli(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """`launcher.cli.main(argv)` in-process: (exit code, stdout, stderr). An exception that
    escapes main is a traceback: the test fails with it."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as e:  # argparse's own usage errors: not a traceback
                assert e.code == 2, f"SystemExit({e.code!r}) escaped main"
                code = "argparse"
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


# --- checks ----------------------------------------------------------------------------------


def sbatch_words(text: str) -> list[str]:
    """The arguments sbatch reads from what follows `#SBATCH` on one line (Slurm's rules:
    a backslash escapes the next character even inside quotes, ' and " quote, an unquoted
    '#' ends the line, unquoted whitespace separates). An unmatched quote is fatal there."""
    words, cur, have = [], [], False
    quote, escape = "", False
    for c in text:
        if escape:
            cur.append(c)
            escape, have = False, True
        elif c == "\\":
            escape = True
        elif quote:
            if c == quote:
                quote = ""
            else:
                cur.append(c)
        elif c in "'\"":
            quote, have = c, True
        elif c == "#":
            break
        elif c in " \t\v\f\r":
            if have:
                words.append("".join(cur))
            cur, have = [], False
        else:
            cur.append(c)
            have = True
    assert not quote, f"sbatch would stop at an unmatched {quote} in #SBATCH{text}"
    if have:
        words.append("".join(cur))
    return words


# What the batch script decides itself (a directive must not reach it by abbreviation).
LAUNCHER_SBATCH = {
    "nodes", "ntasks-per-node", "ntasks", "signal", "output", "error", "job-name", "time",
    "partition", "account", "qos", "requeue", "no-requeue", "open-mode", "array", "wrap",
    "exclusive", "gpus-per-node", "gres", "mem", "segment",
}  # fmt: skip


def check_sbatch(run_dir: Path, plan: dict, recipe: dict, study: bool = False) -> list[str]:
    """`run_dir`: where job.sbatch is (a study's folder when it runs in one allocation)."""
    text = (run_dir / "job.sbatch").read_text(encoding="utf-8")
    options, body_started = [], False
    for line in text.split("\n"):
        if not line.strip():
            continue
        if not line.startswith("#"):
            body_started = True
            continue
        if line.startswith("#SBATCH"):
            assert not body_started, f"an #SBATCH line after the first command: {line!r}"
            rest = line[len("#SBATCH") :]
            assert not re.search("hetjob|packjob", line, re.I), f"sbatch splits the job at {line!r}"
            words = sbatch_words(rest)
            assert len(words) == 1 and words[0].startswith("--"), f"not one option: {line!r}"
            assert words == shlex.split(rest), f"sbatch and bash read {line!r} differently"
            options.append(words[0])
    keys = [o[2:].partition("=")[0] for o in options]
    for k in keys:  # sbatch takes any unambiguous prefix of an option name
        longer = [o for o in {*keys, *LAUNCHER_SBATCH} if o != k and o.startswith(k)]
        assert not longer, f"--{k} abbreviates --{longer[0]}"
    for k in LAUNCHER_SBATCH & {"output", "job-name", "nodes", "signal", "time", "no-requeue"}:
        assert keys.count(k) == 1, f"--{k} {keys.count(k)} times"
    expected_output = f"{run_dir}/slurm/%j_0_log.out"
    assert f"--output={expected_output}" in options, (options, expected_output)
    assert f"--job-name=pd-{recipe['name']}{'-study' if study else ''}" in options
    for k, v in (recipe.get("slurm", {}).get("directives") or {}).items():
        if v is None:
            continue
        key = k.lstrip("-").replace("_", "-")
        assert (f"--{key}" if v is True else f"--{key}={v}") in options, (k, v, options)
    return options


def run_with_recorder(script: Path, case_dir: Path, run_dir: Path, label: str) -> list[list[str]]:
    """Run `script` with the recorder in front of every command line and only the recorder on
    PATH; returns the words each line handed its program."""
    WS.n += 1
    rec_dir = case_dir / f"rec-{label}-{WS.n}"
    rec_dir.mkdir()
    lines = []
    for line in script.read_text(encoding="utf-8").split("\n"):
        if line == render.COMMANDS_GUARD:  # commands.sh's refusal to run whole
            continue
        lines.append(
            line if not line.strip() or line.lstrip().startswith("#") else "pd-exec " + line
        )
    rewritten = rec_dir.with_suffix(".sh")
    rewritten.write_text("\n".join(lines) + "\nwait\n", encoding="utf-8")
    (run_dir / "logs").mkdir(exist_ok=True)
    env = {"PATH": str(WS.stubs), "PD_REC_DIR": str(rec_dir), "SLURM_JOB_ID": "4242", "LC_ALL": "C"}
    p = subprocess.run(
        ["/bin/bash", str(rewritten)], env=env, cwd=case_dir, capture_output=True, timeout=20
    )
    assert p.returncode == 0 and not p.stderr, (label, p.returncode, p.stderr[-2000:])
    assert not MARKER.exists(), f"{label} ran injected code"
    records = []
    for f in rec_dir.iterdir():
        data = f.read_bytes()
        records.append([w.decode("utf-8", "surrogateescape") for w in data.split(b"\0")[:-1]])
    return records


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_commands(run_dir: Path, plan: dict, slurm: bool, case_dir: Path) -> None:
    script = run_dir / "commands.sh"
    records = run_with_recorder(script, case_dir, run_dir, f"cmd-{run_dir.name[-12:]}")
    command_lines = [
        x
        for x in script.read_text(encoding="utf-8").split("\n")
        if x.strip() and not x.startswith("#") and x != render.COMMANDS_GUARD
    ]
    assert len(records) == len(command_lines), "a line is not one command"
    left = list(records)
    for proc in plan["processes"]:
        for k in proc["env"]:
            assert ENV_NAME.match(k), f"{proc['name']}: env name {k!r}"
        # its first command line, then one per restart (args_from_concurrency)
        for argv in [proc["argv"], *[r["argv"] for r in proc.get("restarts") or []]]:
            tail = ["env", *[f"{k}={v}" for k, v in proc["env"].items()], *argv]
            found = [r for r in left
                     if r[-len(tail):] == tail and _prefix_ok(r[: -len(tail)], proc, slurm)]
            assert len(found) == 1, f"{proc['name']}: {len(found)} lines hand it exactly {tail}"
            left.remove(found[0])
        log = run_dir / proc["log"]
        assert log.is_file() and log.parent == run_dir / "logs", f"{proc['name']} logs elsewhere"
    for r in left:  # the preflight and staging steps (the image's, the model's)
        i = r.index("--run-dir") if "--run-dir" in r else -1
        assert (i >= 0 and r[i + 1] == str(run_dir)) or "launcher.control.staging" in r \
            or "launcher.control.image" in r, r
        assert r[0] == ("srun" if slurm else r[0]), r
        _check_mounts(r, run_dir)


def _prefix_ok(prefix: list[str], proc: dict, slurm: bool) -> bool:
    if slurm:
        ok = (
            prefix[:2] == ["srun", "--jobid=4242"]
            and f"--nodelist={proc['node']}" in prefix
            and f"--job-name={proc['name']}" in prefix
        )
        if ok:
            _check_mounts(prefix, None)
        return ok
    return not prefix


def _check_mounts(words: list[str], run_dir: Path | None) -> None:
    """pyxis mounts are one comma-separated list of SRC:DST[:ro]: each must stay whole."""
    for w in words:
        if w.startswith("--container-mounts="):
            for m in w.removeprefix("--container-mounts=").split(","):
                parts = m.split(":")
                assert 2 <= len(parts) <= 3 and all(parts[:2]), f"mount {m!r} in {w!r}"


def check_sbatch_body(run_dir: Path, plan: dict, case_dir: Path) -> None:
    records = run_with_recorder(
        run_dir / "job.sbatch", case_dir, run_dir, f"sb-{run_dir.name[-12:]}"
    )
    python = plan["runtime"]["python"]
    want = ["exec", python, "-u", "-m", "launcher", "run", str(run_dir)]
    assert want in records, (want, records)
    assert ["export", "SUBMITIT_EXECUTOR=slurm"] in records


def check_accepted(runs: Path, out: str, case_dir: Path) -> None:
    run_dirs = sorted(p.parent for p in runs.resolve().rglob("plan.json"))
    assert run_dirs, "exit 0 but no run directory"
    for run_dir in run_dirs:
        plan = json.loads((run_dir / "plan.json").read_text(encoding="utf-8"))
        recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8"))
        # Inside the allocation the orchestrator reads recipe.yaml back and plans again.
        again = recipe_mod.load(str(run_dir / "recipe.yaml"))
        assert again.model_dump() == recipe_mod.validate(recipe, "recipe.yaml").model_dump()
        scripts = [run_dir / "commands.sh"]
        # a study in one allocation submits its folder's job.sbatch for every configuration
        study = not (run_dir / "job.sbatch").exists() and "allocation" in json.loads(
            (run_dir.parent / "study.json").read_text()) if (run_dir.parent / "study.json"
                                                            ).is_file() else False
        job_dir = run_dir.parent if study else run_dir
        slurm = (job_dir / "job.sbatch").exists()
        if slurm:
            scripts.append(job_dir / "job.sbatch")
        for s in scripts:
            p = subprocess.run(["/bin/bash", "-n", str(s)], capture_output=True, timeout=20)
            assert p.returncode == 0, (s.name, p.stderr)
        check_commands(run_dir, plan, slurm, case_dir)
        if slurm:
            check_sbatch(job_dir, plan, recipe, study)
            check_sbatch_body(job_dir, plan, case_dir)
    if out.startswith("["):  # --format json
        assert sorted(d["run_dir"] for d in json.loads(out)) == [str(d) for d in run_dirs]
    else:
        assert out.count("Run directory: ") == len(run_dirs)
        assert all(f"Run directory: {d}  (" in out for d in run_dirs)


def check_rejected(code, out: str, err: str, hints: list[str]) -> None:
    if code == "argparse":  # usage text, then "prog: error: ..." (argparse's format)
        assert ": error: " in err.strip().splitlines()[-1], err
        return
    assert code == 2, (code, err[-3000:])
    assert out == "", out[:500]
    lines = err.split("\n")
    # one line, or problems found together: "error: FILE: N problems:" then a line each
    listed = re.fullmatch(r"error: .*: (\d+) problems:", lines[0])
    want = 2 + (int(listed.group(1)) if listed else 0)
    assert len(lines) == want and lines[-1] == "", f"not one line: {err[:1500]!r}"
    line = lines[0]
    assert line.startswith("error: "), line
    assert all(x.startswith("  - ") for x in lines[1:-1]), err[:1500]
    for x in lines[:-1]:
        assert len(x) <= 600, f"{len(x)} characters: {x[:300]}..."
    low = err.lower()
    named = [h for h in hints if h and h.lower() in low]
    assert named, f"names none of {sorted(set(hints))[:12]}: {line}"


def check_no_secrets(root: Path | None, out: str) -> None:
    for s in SECRETS:
        assert s not in out
    for f in root.rglob("*") if root else ():
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            for s in SECRETS:
                assert s.encode() not in data, f"{s} in {f}"


def run_case(case: dict) -> None:
    case_dir = WS.new_case()
    try:
        argv, hints, runs, secret = materialize(case, case_dir)
        LAST["argv"] = argv
        start = time.monotonic()
        code, out, err = run_cli(argv, case_dir)
        took = time.monotonic() - start
        STATS["cases"] += 1
        STATS["seconds"] += took
        STATS["slowest"] = max(STATS["slowest"], took)
        assert took < CASE_LIMIT_S, f"{took:.1f} s for {argv}"
        if code == 0:
            STATS["accepted"] += 1
            assert not secret, f"a secret in a flag or knob was accepted: {argv}"
            check_accepted(runs if runs.is_absolute() else case_dir / runs, out, case_dir)
        else:
            STATS["rejected"] += 1
            check_rejected(code, out, err, hints)
        written = runs if runs.is_absolute() else case_dir / runs
        try:
            exists = written.is_dir()
        except OSError:  # a name too long to look up: nothing was written there
            exists = False
        check_no_secrets(written if exists else None, out)
        assert not MARKER.exists()
    finally:
        shutil.rmtree(case_dir, ignore_errors=True)


# --- the properties --------------------------------------------------------------------------

WS: Workspace


@pytest.fixture(scope="module", autouse=True)
def workspace(tmp_path_factory):
    global WS
    WS = Workspace(tmp_path_factory.mktemp("fuzz"))
    saved = {k: os.environ.get(k) for k in ENV_SECRETS}
    os.environ.update(ENV_SECRETS)
    yield WS
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def fuzz(max_examples: int) -> settings:
    """Deterministic in CI (derandomized, no example database), every case under the limit."""
    return settings(
        max_examples=max_examples, derandomize=True, database=None, print_blob=True,
        deadline=int(CASE_LIMIT_S * 1000) * 2,  # the CLI's own 5 s is asserted in run_case
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much, HealthCheck.large_base_example],
    )  # fmt: skip


@fuzz(220)
@given(cases("recipe"))
def test_fuzz_recipes(case):
    PROPERTIES_RUN.add("recipes")
    run_case(case)


@fuzz(130)
@given(cases("set"))
def test_fuzz_set(case):
    PROPERTIES_RUN.add("set")
    run_case(case)


@fuzz(70)
@given(cases("sweep"))
def test_fuzz_sweep(case):
    PROPERTIES_RUN.add("sweep")
    run_case(case)


@fuzz(50)
@given(cases("nodelist"))
def test_fuzz_nodelist(case):
    PROPERTIES_RUN.add("nodelist")
    run_case(case)


@fuzz(50)
@given(cases("runs_dir"))
def test_fuzz_runs_dir(case):
    PROPERTIES_RUN.add("runs_dir")
    run_case(case)


def test_fuzz_case_count():
    """Runs after the properties above (file order): the run met the issue's floor."""
    if len(PROPERTIES_RUN) < 5:
        pytest.skip("counts only when every property above ran")
    print(f"fuzz: {STATS}")
    assert STATS["cases"] >= MIN_CASES, STATS
    assert STATS["accepted"] >= 50 and STATS["rejected"] >= 50, STATS


# --- the in-process results hold for the real command --------------------------------------

SUBPROCESS_CASES = [
    ["--set=env.X=$(echo pwned)", "local-sim"],
    ["--set=slurm.directives.comment=a b 'c' \"d\" $(x) `y`", "devcluster-sim"],
    ["--set=decode.data_parallel=10000000", "qwen3.5-397b-gb200-disagg"],
    ["--nodelist=n[0-99999999]", "local-sim"],
    ["--sweep=model.served_name=a/b,c d", "local-sim"],
    ["--set=vllm_args.api-key=" + FLAG_SECRET, "local-sim"],
    ["--set=slurm.directives.tim=5", "devcluster-sim"],
    ["--set=env.X=a\udcffb", "local-sim"],  # a byte that is not UTF-8 on the command line
    ["--nodelist=n1\nn2,n3,n4", "local-sim"],
]


@pytest.mark.parametrize("args", SUBPROCESS_CASES, ids=lambda a: a[0][:40])
def test_subprocess_agrees_with_in_process(args, tmp_path):
    argv = ["submit", "--dry-run", f"--runs-dir={tmp_path / 'runs'}", *args[:-1], "--", args[-1]]
    code, out, err = run_cli(argv, tmp_path)
    env = dict(os.environ, **ENV_SECRETS, PYTHONPATH=str(REPO))
    p = subprocess.run(
        [sys.executable, "-m", "launcher", *argv], capture_output=True, text=True,
        cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert (p.returncode, p.stderr) == (code, err)
    assert "Traceback" not in p.stderr
    if code == 0:
        assert out.count("Run directory:") == p.stdout.count("Run directory:")
    check_no_secrets(tmp_path / "runs", p.stdout + out)


# --- the read-side commands: a run name or runs directory the filesystem refuses ------------

LONG = "x" * 300  # over NAME_MAX (255 bytes): stat() fails with ENAMETOOLONG, not ENOENT


@pytest.mark.parametrize("argv", [
    ["status", LONG], ["logs", LONG], ["cancel", LONG], ["report", LONG], ["recommend", LONG],
    ["runs", f"--runs-dir=/tmp/{LONG}"], ["status", f"--runs-dir=/tmp/{LONG}"],
    ["status", "--runs-dir=/etc/passwd/runs"],
], ids=lambda a: " ".join(a)[:30])
def test_read_commands_refuse_unusable_paths_in_one_sentence(argv, tmp_path):
    code, out, err = run_cli(argv, tmp_path)
    assert code == 2, (code, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
