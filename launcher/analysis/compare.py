"""Two runs side by side: what differs in what was asked for, in what ran, and in the
figures (`python -m launcher diff RUN_A RUN_B`).

- settings: the resolved recipes (recipe.yaml), key by key;
- processes: every process's argv (flag by flag) and environment from plan.json, with
  what differs by construction between any two runs left out (the run directory, ports,
  which the job id shifts, and node names when the allocation differs);
- fingerprint drift: engine version, image, every package of the engine's environment,
  torch's CUDA, driver and GPU models (run.json's identity), the launcher's version and
  commit (submission.json);
- per sweep point present in both: tok/s per working GPU, tok/s per user, TTFT and TPOT
  p50/p99, and accuracy, with the change in per cent and, where other runs repeat A or B
  (the same resolved recipe, no drift), whether it is outside their run-to-run spread.

A comparison is single-variable when exactly one setting differs and nothing drifted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from launcher.run import numbers
from launcher.run.rundir import RunDir, read_json
from launcher.run.vocab import State

FIGURES = {
    "total_tokens_per_s_per_gpu": "tok/s/working GPU",
    "tokens_per_s_per_user": "tok/s/user",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "tpot_p50_ms": "TPOT p50 ms",
    "tpot_p99_ms": "TPOT p99 ms",
}
SAME_BY_NATURE = ("name", "description")  # a run's own name is not a setting
_PORT = re.compile(r":\d{2,5}\b")
_IPV4 = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _recipe_doc(rd: RunDir) -> dict[str, Any] | None:
    """recipe.yaml as written; None when it cannot be read."""
    import yaml

    try:
        doc = yaml.safe_load((rd.path / "recipe.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    return doc if isinstance(doc, dict) else None


def _recipe(rd: RunDir) -> dict[str, Any] | None:
    """The resolved recipe, flat; None when recipe.yaml cannot be read."""
    doc = _recipe_doc(rd)
    if doc is None:
        return None
    flat = _flat(doc)
    return {k: _normal(v, rd) for k, v in flat.items() if k not in SAME_BY_NATURE}


def _normal(v: Any, rd: RunDir) -> Any:
    """A value with the run's own directory written as <RUN_DIR> (inputs are copied in)."""
    if isinstance(v, str):
        return v.replace(str(rd.path), "<RUN_DIR>")
    if isinstance(v, list):
        return [_normal(x, rd) for x in v]
    return v


def settings(a: RunDir, b: RunDir) -> list[tuple[str, Any, Any]] | None:
    """The settings that differ; None when either run's recipe.yaml cannot be read."""
    ra, rb = _recipe(a), _recipe(b)
    if ra is None or rb is None:
        return None
    return [(k, ra.get(k), rb.get(k)) for k in sorted(set(ra) | set(rb)) if ra.get(k) != rb.get(k)]


def _argv_map(argv: list[str]) -> dict[str, str]:
    """`--flag value` and `--flag` as {flag: value}; the words before the first flag as
    {"<command>": ...}."""
    out: dict[str, str] = {}
    i = 0
    head = []
    while i < len(argv) and not argv[i].startswith("--"):
        head.append(argv[i])
        i += 1
    out["<command>"] = " ".join(head)
    while i < len(argv):
        flag = argv[i]
        if "=" in flag:
            k, v = flag.split("=", 1)
            out[k] = v
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[flag] = argv[i + 1]
            i += 2
        else:
            out[flag] = ""
            i += 1
    return out


def _by_nature(key: str) -> bool:
    k = key.lower()
    return "port" in k or k.endswith(("_host", "-address", "_ip")) or k in ("--run-dir",)


def _key(name: str, nodes: list[str]) -> str:
    """A process by its part and the index of its node in the plan (node names differ
    between allocations)."""
    for i, n in enumerate(nodes):
        name = name.replace(f"@{n}", f"@<node{i}>")
    return name


def _clean(v: str, rd: RunDir, nodes: list[str]) -> str:
    v = _PORT.sub(":<port>", v.replace(str(rd.path), "<RUN_DIR>"))
    for i, n in enumerate(nodes):
        v = v.replace(n, f"<node{i}>")
    return _IPV4.sub("<node>", re.sub(r"<node\d+>", "<node>", v))


def processes(a: RunDir, b: RunDir) -> list[str]:
    pa, pb = read_json(a.plan) or {}, read_json(b.plan) or {}
    na = [n["name"] for n in pa.get("nodes") or []]
    nb = [n["name"] for n in pb.get("nodes") or []]
    by_a = {p["name"]: p for p in pa.get("processes") or []}
    by_b = {p["name"]: p for p in pb.get("processes") or []}
    # a process is its role and rank, not the node it landed on
    key_a = {_key(n, na): p for n, p in by_a.items()}
    key_b = {_key(n, nb): p for n, p in by_b.items()}
    out = []
    for name in sorted(set(key_a) | set(key_b)):
        x, y = key_a.get(name), key_b.get(name)
        if x is None or y is None:
            out.append(f"{name}: only in {'B' if x is None else 'A'}")
            continue
        for what, da, db in (("argv", _argv_map(x.get("argv") or []), _argv_map(y.get("argv") or [])),
                             ("env", x.get("env") or {}, y.get("env") or {})):
            for k in sorted(set(da) | set(db)):
                if _by_nature(k):
                    continue
                va, vb = da.get(k), db.get(k)
                va = None if va is None else _clean(str(va), a, na)
                vb = None if vb is None else _clean(str(vb), b, nb)
                if va != vb:
                    out.append(f"{name} {what} {k}: {va} -> {vb}")
    return out


def drift(a: RunDir, b: RunDir) -> list[tuple[str, Any, Any]]:
    ra, rb = a.read_record(), b.read_record()
    ia, ib = (ra.identity if ra else None) or {}, (rb.identity if rb else None) or {}
    out = []
    for key in ("engine", "engine_version", "engine_commit", "image", "model",
                "model_revision", "torch_cuda", "driver", "gpu_models", "imex_channel",
                "packages_differ_on"):
        if ia.get(key) != ib.get(key):
            out.append((key, ia.get(key), ib.get(key)))
    pa, pb = ia.get("packages") or {}, ib.get("packages") or {}
    for name in sorted(set(pa) | set(pb)):
        if pa.get(name) != pb.get(name):
            out.append((f"package {name}", pa.get(name), pb.get(name)))
    la, lb = a.read_submission().launcher, b.read_submission().launcher
    if la != lb:
        out.append(("launcher", la, lb))
    return out


def points(rd: RunDir) -> dict[Any, dict]:
    from launcher.run import figures

    s = read_json(rd.summary)
    if s is None:  # a run still going, or one that died before its report: from bench/
        try:
            s = figures.summary(rd.path)
        except Exception:  # noqa: BLE001 - a run that cannot be summed has no points
            s = {}
    return {p.get("max_concurrency"): p for p in s.get("points") or [] if isinstance(p, dict)}


def figures(a: RunDir, b: RunDir) -> list[dict[str, Any]]:
    pa, pb = points(a), points(b)
    rows = []
    for c in sorted(set(pa) & set(pb), key=lambda c: (c is None, c or 0)):
        for key, label in FIGURES.items():
            va, vb = pa[c].get(key), pb[c].get(key)
            if isinstance(va, int | float) and isinstance(vb, int | float):
                change = (vb - va) / va * 100 if va else None
                rows.append({"concurrency": c, "figure": label, "a": va, "b": vb,
                             "change_pct": change})
    for rd_key, (x, y) in {"accuracy": ((read_json(a.summary) or {}).get("accuracy"),
                                        (read_json(b.summary) or {}).get("accuracy"))}.items():
        if isinstance(x, dict) and isinstance(y, dict):
            va, vb = x.get("accuracy"), y.get("accuracy")
            if isinstance(va, int | float) and isinstance(vb, int | float):
                rows.append({"concurrency": None, "figure": f"{rd_key} ({x.get('harness')} / "
                             f"{y.get('harness')} harness)", "a": va, "b": vb,
                             "change_pct": (vb - va) / va * 100 if va else None})
    return rows


def repeats(run: RunDir, pool: list[RunDir]) -> list[RunDir]:
    """The runs of `pool` that repeat `run`: the same resolved recipe and no fingerprint
    drift (`run` itself included first). Only they measure run-to-run spread."""
    run = run_at(run.path)
    name = _recipe_name(run)
    out, seen = [run], {run.path}
    for other in pool:
        other = run_at(other.path)
        where = other.path
        if where in seen or _recipe_name(other) != name:
            continue
        seen.add(where)
        if settings(run, other) == [] and not drift(run, other):
            out.append(other)
    return out


def _recipe_name(rd: RunDir) -> str | None:
    return (_recipe_doc(rd) or {}).get("name")


def spread(groups: list[list[RunDir]]) -> dict[tuple[Any, str], dict[str, Any]]:
    """Per (concurrency, figure): the widest range over each group of repeats that holds two
    runs or more, in per cent of that group's mean, and how many runs it is from."""
    out: dict[tuple[Any, str], dict[str, Any]] = {}
    for group in groups:
        if len(group) < 2:
            continue
        values: dict[tuple[Any, str], list[float]] = {}
        for rd in group:
            for c, point in points(rd).items():
                for key, label in FIGURES.items():
                    v = point.get(key)
                    if isinstance(v, int | float):
                        values.setdefault((c, label), []).append(float(v))
        for k, vs in values.items():
            mean = sum(vs) / len(vs)
            if len(vs) < 2 or not mean:
                continue
            pct = (max(vs) - min(vs)) / mean * 100
            if k not in out or pct > out[k]["pct"]:
                out[k] = {"pct": pct, "runs": len(vs)}
    return out


def pool(runs_dir: Path, *runs: Path) -> list[RunDir]:
    """Where repeats of `runs` are looked for: the runs directory and each run's own (a
    study member's: the study's parent)."""
    from launcher.run import listing

    homes = {Path(runs_dir).resolve()}
    for p in runs:
        rd = run_at(p)
        homes.add(rd.path.parent.parent if listing.study_of(rd) else rd.path.parent)
    return [run_at(r.path) for h in sorted(homes) if h.is_dir() for r in listing.all_runs(h)]


def run_at(p: Path) -> RunDir:
    """A run by its absolute path, the one form every comparison uses: its recipe and
    commands name it so, and a repeat is told apart from the run itself by it."""
    return RunDir(Path(p).resolve())


def compare(a: Path, b: Path, pool: list[RunDir] | None = None) -> dict[str, Any]:
    """`pool`: other runs to find repeats of A and of B in (the run-to-run spread)."""
    ra, rb = run_at(a), run_at(b)
    never = {side: st.shown_state for side, st in (("A", ra.status()), ("B", rb.status()))
             if st.state in (State.PLANNED, State.SUBMITTED, State.REFUSED)
             or st.record is None}
    # a run with no fingerprint (refused, a dry-run, not yet at its preflight) has nothing
    # that could have drifted: said as never started, not as every item changed
    printed = all(st.record and st.record.identity for st in (ra.status(), rb.status()))
    sets, drifted = settings(ra, rb), (drift(ra, rb) if printed and not never else [])
    rows = figures(ra, rb)
    groups = [repeats(ra, pool or []), repeats(rb, pool or [])]
    known = spread(groups)
    for row in rows:
        sp = known.get((row["concurrency"], row["figure"]))
        row["spread_pct"] = None if sp is None else sp["pct"]
        row["outside_spread"] = (None if sp is None or row["change_pct"] is None
                                 else abs(row["change_pct"]) > sp["pct"])
    return {"a": str(ra.path), "b": str(rb.path), "settings": sets,
            "processes": processes(ra, rb), "drift": drifted, "figures": rows,
            "single_variable": sets is not None and len(sets) == 1 and not drifted
            and not never,
            "never_started": list(never), "states": never,
            "repeats": {"a": [str(r.path) for r in groups[0][1:]],
                        "b": [str(r.path) for r in groups[1][1:]]}}


def show(v: Any) -> str:
    """A setting's or fingerprint item's value as a person reads it: '(not set)' for none."""
    if v is None:
        return "(not set)"
    return json.dumps(v) if not isinstance(v, str) else v


def verdict(r: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, head, rest) of the comparison: kind is single | repeat | unknown | not."""
    sets, drifted = r["settings"], r["drift"]
    never = r.get("states") or {}
    if never:
        who = " and ".join(f"{side} never started ({state})" for side, state in never.items())
        return ("unknown", "NOT known to be single-variable",
                f"{who}: it has no fingerprint and no figures to compare, only settings")
    if sets is None:
        return ("unknown", "NOT known to be single-variable",
                "a recipe.yaml is missing or unreadable, so the settings cannot be compared")
    if r["single_variable"]:
        return "single", "single-variable", f"only {sets[0][0]} differs, and nothing drifted"
    if not sets and not drifted:
        return ("repeat", "a repeat", "no setting differs and nothing drifted (what differs in "
                "the figures is run-to-run)")
    why = [f"{len(sets)} settings differ"] if len(sets) != 1 else []
    why += [f"{len(drifted)} fingerprint item(s) drifted"] if drifted else []
    return "not", "NOT single-variable", ", ".join(why)


def text(r: dict[str, Any]) -> str:
    out = [f"A {r['a']}", f"B {r['b']}"]
    _, head, rest = verdict(r)
    out.append(f"{head}: {rest}")
    sets, drifted = r["settings"] or [], r["drift"]
    out.append("settings (resolved recipe):" if sets else
               "settings: the same" if r["settings"] is not None else "settings: unknown")
    out += [f"  {k}: {show(x)} -> {show(y)}" for k, x, y in sets]
    procs = r["processes"]
    out.append("processes (argv, environment):" if procs else
               "processes: the same argv and environment (ports, run directory and node "
               "names aside)")
    out += [f"  {line}" for line in procs[:60]]
    if len(procs) > 60:
        out.append(f"  ... and {len(procs) - 60} more")
    out.append("fingerprint drift:" if drifted else
               "fingerprint: unknown (a run that never started has none)"
               if r.get("never_started") else "fingerprint: no drift")
    out += [f"  {k}: {show(x)} -> {show(y)}" for k, x, y in drifted]
    rows = r["figures"]
    reps = r.get("repeats") or {}
    n_a, n_b = len(reps.get("a") or []), len(reps.get("b") or [])
    if not rows:
        out.append("figures: no sweep point in both")
    elif n_a or n_b:
        out.append(f"figures (B against A; run-to-run spread from repeats in the runs "
                   f"directory: A with {n_a}, B with {n_b}):")
    else:
        out.append("figures (B against A; run-to-run spread unknown: no repeat of either run "
                   "in the runs directory):")
    for row in rows:
        where = "" if row["concurrency"] is None else f"c={row['concurrency']} "
        ch = "" if row["change_pct"] is None else f" ({numbers.signed_pct(row['change_pct'])})"
        sp = row.get("spread_pct")
        if sp is not None and row.get("outside_spread") is not None:
            # outside: a larger change than the widest seen between repeats
            ch += (f", outside the run-to-run spread ({sp:.1f} %)" if row["outside_spread"]
                   else f", within the run-to-run spread ({sp:.1f} %)")
        a, b = numbers.same_digits(row["a"], row["b"])
        out.append(f"  {where}{row['figure']}: {a} -> {b}{ch}")
    return "\n".join(out)
