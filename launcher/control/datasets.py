"""Session traces for the agentic benchmark: read (a malformed one is one sentence), staged
once onto the shared filesystem, and checked before a run (docs/agentic.md).

    python -m launcher stage-dataset TRACE --cluster PROFILE [--runs-dir DIR]

- A local mooncake_trace file: every line read as AIPerf reads it; copied to
  `<runs-dir>/.pd-datasets/<name>` (the nodes read the run folder's filesystem), and the
  path to set as `benchmark.agentic.trace` printed.
- One of AIPerf's public corpora by name: downloaded once into the profile's
  `models.hf_home` (a Hugging Face dataset cache, what AIPerf's loader reads with
  HF_HUB_OFFLINE=1 on nodes without internet); needs `huggingface_hub` here.
- At dry-run: a local trace that is missing or malformed refuses the run; a corpus not in
  the cache is a `blocker:` with the command above.

Standard library only, plus `huggingface_hub` where a download really happens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from launcher.errors import UserError
from launcher.schema.sections import AGENTIC_CORPORA, AIPERF_VERSION

STAGED = ".pd-datasets"
MAX_LINES = 5_000_000


def read_mooncake(path: Path, block_size: int = 512) -> dict[str, int]:
    """{session: its longest context in tokens} of a mooncake_trace file; UserError naming
    the first line that AIPerf would refuse. A session's turns carry its history, so its
    context grows by each turn's input and output."""
    sessions: dict[str, int] = {}
    lone = 0
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as e:
        raise UserError(f"benchmark.agentic.trace {path}: cannot be read ({e.strerror}); "
                        "give a mooncake_trace JSONL file that exists") from None
    with f:
        n = 0
        for n, line in enumerate(f, 1):
            if n > MAX_LINES:
                raise UserError(f"benchmark.agentic.trace {path}: more than {MAX_LINES:,} "
                                "lines; split it or play part of it")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise UserError(f"benchmark.agentic.trace {path}: line {n} is not JSON (a "
                                "file cut short?); each line is one turn as a JSON object"
                                ) from None
            why = _row_problem(row, block_size)
            if why:
                raise UserError(f"benchmark.agentic.trace {path}: line {n} {why}")
            sid = row.get("session_id")
            if sid is None:
                lone += 1
                sid = f"\0{lone}"
            isl = row.get("input_length") or 0
            sessions[sid] = sessions.get(sid, 0) + isl + (row.get("output_length") or 0)
    if not sessions:
        raise UserError(f"benchmark.agentic.trace {path}: holds no turns; each line is one "
                        "turn as a JSON object (mooncake_trace)")
    return sessions


def _row_problem(row, block_size: int) -> str | None:
    """Why AIPerf's mooncake_trace reader would refuse this line, in words; None if fine."""
    if not isinstance(row, dict):
        return "is not a JSON object"
    modes = [k for k in ("input_length", "text_input", "messages", "payload") if k in row]
    if len(modes) != 1:
        return ("needs exactly one of input_length, text_input, messages, payload (it has "
                + (", ".join(modes) or "none") + ")")
    for k in ("input_length", "output_length"):
        v = row.get(k)
        if k in row and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            return f"has {k} {json.dumps(v)}: a whole number of tokens, at least 1"
    for k in ("delay", "timestamp"):
        v = row.get(k)
        if k in row and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
            return f"has {k} {json.dumps(v)}: milliseconds, a number >= 0"
    h = row.get("hash_ids")
    if "hash_ids" in row and (not isinstance(h, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in h)):
        return "has hash_ids that are not a list of whole numbers"
    if "session_id" in row and not isinstance(row["session_id"], str):
        return "has a session_id that is not text"
    n, isl = len(h or []), row.get("input_length")
    if n and isl and not (n - 1) * block_size < isl <= n * block_size:
        return (f"has input_length {isl} for {n} hash_ids of {block_size} tokens (AIPerf "
                f"needs more than {(n - 1) * block_size} and at most {n * block_size}); set "
                "benchmark.agentic.block_size to the trace's block size")
    return None


def corpus_dir(hf_home: str, corpus: str) -> Path:
    """Where the Hugging Face cache keeps a corpus's dataset."""
    repo = AGENTIC_CORPORA[corpus][1]
    return Path(hf_home) / "hub" / f"datasets--{repo.replace('/', '--')}"


def corpus_staged(hf_home: str | None, corpus: str) -> bool:
    snaps = corpus_dir(hf_home, corpus) / "snapshots" if hf_home else None
    return bool(snaps and snaps.is_dir() and any(snaps.iterdir()))


def check(recipe, cluster) -> tuple[str | None, str | None]:
    """(a blocker, a note for the plan text) about an agentic run's trace; a local trace
    that is missing or malformed raises UserError (nothing could run)."""
    ag = recipe.benchmark.agentic
    if ag is None:
        return None, None
    # the profile as the recipe names it (a path for a profile of one's own)
    hint = f"python -m launcher stage-dataset {ag.trace} --cluster {recipe.cluster}"
    if ag.corpus:
        repo = AGENTIC_CORPORA[ag.corpus][1]
        if not cluster.models.hf_home:
            return (f"the corpus {ag.corpus} ({repo}) needs the profile's models.hf_home, a "
                    f"shared Hugging Face cache to stage it in; set it, then {hint}"), None
        if not corpus_staged(cluster.models.hf_home, ag.corpus):
            return (f"the corpus {ag.corpus} ({repo}) is not staged in "
                    f"{cluster.models.hf_home}: {hint}"), None
        return None, f"corpus {ag.corpus} ({repo}) staged in {cluster.models.hf_home}"
    path = Path(ag.trace)
    if ag.trace_format == "mooncake_trace":
        sessions = read_mooncake(path, ag.block_size)
        longest = max(sessions.values())
        from launcher.planning.plan import max_model_len

        limit = max_model_len(recipe)
        if limit and longest > limit[0] and not (ag.max_context and ag.max_context <= limit[0]):
            raise UserError(
                f"benchmark.agentic.trace {path}: a session reaches {longest:,} tokens of "
                f"context but {limit[1]} is shorter; raise it, or set "
                "benchmark.agentic.max_context to drop such sessions")
        return None, (f"trace {path}: {len(sessions):,} sessions, the longest context "
                      f"{longest:,} tokens")
    if not path.exists():
        raise UserError(f"benchmark.agentic.trace {path}: no such file or folder; give a "
                        "weka_trace file or folder that exists")
    return None, f"trace {path} (weka_trace, read by AIPerf)"


# InferenceX's AgentX FAQ (InferenceX-app blog agentx-how-the-benchmark-works-faq.mdx,
# 2026-08-11): the Weka corpora's median request, 142,016 input + 444 output tokens
CORPUS_MEDIAN_CONTEXT = 142_016 + 444


def context_of(recipe) -> tuple[int, str] | None:
    """The context a live session holds, in tokens, and where the figure comes from: a
    local mooncake_trace's mean session context, or a corpus's published median request."""
    ag = recipe.benchmark.agentic
    if ag is None:
        return None
    if ag.corpus:
        return CORPUS_MEDIAN_CONTEXT, ("the Weka corpora's published median request, "
                                       "InferenceX's AgentX FAQ")
    if ag.trace_format != "mooncake_trace":
        return None
    try:
        sessions = read_mooncake(Path(ag.trace), ag.block_size)
    except UserError:
        return None
    mean = round(sum(sessions.values()) / len(sessions))
    return mean, f"the trace's mean session context, {len(sessions):,} sessions"


def aiperf_check(plan) -> tuple[str | None, str | None]:
    """(a blocker, a note) about the aiperf an agentic run calls: the staged one must be
    on the shared filesystem (`env prepare --aiperf`); one the recipe names, or PATH's, is
    checked where the nodes are this host (the local profile, the dev cluster), elsewhere
    it is the router node's, not seen from here."""
    from launcher.control import compute_env
    from launcher.planning.schedulers import shares_one_host

    ag = plan.recipe.benchmark.agentic
    if ag is None:
        return None, None
    cluster = plan.cluster
    if plan.staged_aiperf:
        if not compute_env.aiperf_staged(plan.runtime):
            return (f"AIPerf {AIPERF_VERSION} is not staged for {cluster.name}'s nodes "
                    f"({plan.runtime.arch}, Python {plan.runtime.python_version}): python -m "
                    f"launcher env prepare --cluster {plan.recipe.cluster} --aiperf"), None
        return None, (f"{plan.aiperf} (AIPerf {AIPERF_VERSION} staged in "
                      f"{plan.staged_aiperf}; the job builds its venv from the wheels once)")
    if not shares_one_host(cluster):
        return None, (f"{plan.aiperf} on the router's node (its environment is the site's, "
                      "not checked from here: docs/agentic.md)")
    exe = shutil.which(plan.aiperf)
    if exe is None:
        return (f"benchmark.agentic.aiperf {plan.aiperf} is not a command on this host: "
                f"install AIPerf {AIPERF_VERSION} in an environment of its own (bash "
                "tests/aiperf/setup.sh makes one) and name its aiperf"), None
    found = sorted(Path(exe).resolve().parent.parent.glob(
        "lib/python*/site-packages/aiperf-*.dist-info"))
    version = found[-1].name.removeprefix("aiperf-").removesuffix(".dist-info") if found else None
    return None, exe + (f" (aiperf {version})" if version else "")


def stage(trace: str, cluster, runs_dir: Path, block_size: int = 512) -> Path:
    """Put a trace where the nodes read it; returns its path there."""
    if trace in AGENTIC_CORPORA:
        hf_home = cluster.models.hf_home
        if not hf_home:
            raise UserError(f"stage-dataset {trace}: the profile {cluster.name} has no "
                            "models.hf_home (the shared Hugging Face cache AIPerf reads); set it")
        if corpus_staged(hf_home, trace):
            return corpus_dir(hf_home, trace)
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise UserError("stage-dataset needs huggingface_hub here: pip install "
                            "huggingface_hub") from None
        return Path(snapshot_download(repo_id=AGENTIC_CORPORA[trace][1], repo_type="dataset",
                                      cache_dir=str(Path(hf_home) / "hub")))
    src = Path(trace)
    if src.is_dir() or not src.name.endswith((".jsonl", ".json")) and src.exists():
        raise UserError(f"stage-dataset {trace}: give a mooncake_trace JSONL file (a folder "
                        "or weka corpus is staged by copying it onto the shared filesystem)")
    if trace not in AGENTIC_CORPORA and "/" not in trace and not src.exists():
        raise UserError(f"stage-dataset {trace}: neither a file here nor a corpus AIPerf "
                        "0.13.0 knows (" + ", ".join(AGENTIC_CORPORA) + ")")
    read_mooncake(src, block_size)
    dest = runs_dir / STAGED / src.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    shutil.copyfile(src, tmp)
    tmp.replace(dest)
    return dest
