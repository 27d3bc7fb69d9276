"""`python -m launcher ...`: the command line. Imports stay light until a command needs more."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from launcher.control.visibility import default_runs_dir
from launcher.errors import UserError

DEFAULT_RUNS = default_runs_dir()  # $PD_RUNS_DIR, else ./runs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher",
        description="Disaggregated prefill/decode vLLM on Slurm: plan, submit, measure, inspect.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_plan_commands(sub)
    _add_run_commands(sub)
    _add_result_commands(sub)
    _add_service_commands(sub)
    return p


def _add_plan_commands(sub: argparse._SubParsersAction) -> None:
    """recipes, submit, env, stage-model, run: what to run and running it."""
    s = sub.add_parser("recipes", help="list the shipped recipes; `show NAME`: one resolved; "
                       "`fields`: every recipe key with its default; `import FILE`: an "
                       "srt-slurm recipe as one of ours")
    s.add_argument("action", nargs="?", choices=("list", "show", "fields", "import"),
                   default="list", help="list (default), show one recipe resolved, every "
                   "recipe field, or import an srt-slurm recipe")
    s.add_argument("name", nargs="?", help="for show: a recipe path or shipped name; for "
                   "import: the srt-slurm recipe file")
    s.add_argument("-o", "--output", metavar="OUT",
                   help="for import: write the recipe here (default: standard output)")
    s.add_argument("--alias", action="append", default=[], metavar="NAME=VALUE",
                   help="for import: what a model or container alias of your srtslurm.yaml "
                        "stands for")
    s.add_argument("--site", type=Path, metavar="SRTSLURM_YAML",
                   help="for import and show: a site's srtslurm.yaml (its aliases, mounts and "
                        "defaults); default ./srtslurm.yaml when there is one")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="for show: override a field (a.b.c=value), as submit takes it")
    s.set_defaults(func=cmd_recipes)

    s = sub.add_parser("submit", help="allocate nodes and run a recipe (or --dry-run)")
    s.add_argument("recipe", nargs="*",
                   help="a recipe YAML path (ours or srt-slurm's) or the name of a shipped "
                        "recipe; several make a study, one configuration each")
    s.add_argument("--again", metavar="RUN",
                   help="submit the exact resolved recipe of an earlier run (its recipe.yaml)")
    _recipe_options(s)
    s.add_argument("--site", type=Path, metavar="SRTSLURM_YAML",
                   help="for an srt-slurm recipe: the site's srtslurm.yaml (aliases, mounts, "
                        "defaults); default ./srtslurm.yaml when there is one")
    s.add_argument(
        "--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
        help="one configuration per value (several --sweep: every combination), grouped as a "
             "study",
    )  # fmt: skip
    s.add_argument(
        "--slo", metavar="LIMITS",
        help="latency limits, e.g. 'ttft_p99<=2s,itl_p90<=30ms' (benchmark.slo.limits): each "
             "configuration's sweep searches for the highest concurrency meeting them all, "
             "and the study names the best configuration (docs/slo.md)",
    )  # fmt: skip
    s.add_argument(
        "--allocation", choices=("one", "each"), default=None,
        help="a study's configurations in one allocation (each engine loaded once, a router "
             "per configuration) or one job each; default: whichever the dry-run estimates "
             "at fewer GPU-hours",
    )  # fmt: skip
    s.add_argument("--alias", action="append", default=[], metavar="NAME=VALUE",
                   help="for an srt-slurm recipe: what a model or container alias of your "
                        "srtslurm.yaml stands for")
    s.add_argument(
        "--dry-run", action="store_true", help="write and show everything, submit nothing"
    )
    s.add_argument("--format", choices=("text", "json"), default="text",
                   help="the plan as text (default) or as JSON, one object per run")
    s.add_argument("--wait", action="store_true",
                   help="follow a Slurm job until it ends and Slurm has released its nodes")
    s.add_argument(
        "--check", action="store_true",
        help="ask the scheduler (sbatch --test-only) whether it takes the job; submit nothing",
    )  # fmt: skip
    s.add_argument(
        "--nodelist", help="plan the dry-run on these node names (default: the profile's)"
    )
    s.set_defaults(func=cmd_submit)

    s = sub.add_parser("env", help="the compute nodes' environment (shared compute_env mode)")
    s.add_argument("action", choices=("prepare", "show"),
                   help="prepare: fetch the wheels for the nodes; show: what is there")
    s.add_argument("--cluster", required=True, help="a cluster profile name or YAML path")
    s.add_argument("--aiperf", action="store_true",
                   help="prepare: also stage the pinned AIPerf (the agentic benchmark's "
                   "client, about 230 MB of wheels) for the nodes")
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="where runs live (default: %(default)s)")
    s.set_defaults(func=cmd_env)

    s = sub.add_parser("stage-model", help="fetch a hub model once into the profile's HF cache")
    s.add_argument("model", help="org/name on the Hugging Face hub")
    s.add_argument("--cluster", required=True, help="a cluster profile name or YAML path")
    s.add_argument("--revision", default=None,
                   help="a branch, tag or commit of the model (default: the hub's main)")
    s.set_defaults(func=cmd_stage_model)

    s = sub.add_parser("stage-dataset", help="put an agentic session trace where the nodes "
                                             "read it (a trace file, or an AIPerf corpus name)")
    s.add_argument("trace", help="a mooncake_trace JSONL file, or one of AIPerf's public "
                                 "corpora (e.g. semianalysis_cc_traces_weka_062126)")
    s.add_argument("--cluster", required=True, help="a cluster profile name or YAML path")
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS,
                   help="where runs live; a trace file goes to its .pd-datasets folder "
                        "(default: %(default)s)")
    s.add_argument("--block-size", type=int, default=512,
                   help="tokens per hash id of a mooncake_trace (benchmark.agentic.block_size; "
                        "default: %(default)s)")
    s.set_defaults(func=cmd_stage_dataset)

    s = sub.add_parser("run", help="run a prepared run directory, or a study prepared for one "
                                   "allocation, here (inside an allocation, e.g. under salloc)")
    s.add_argument("run_dir", type=Path, metavar="RUN_OR_STUDY_DIR",
                   help="a directory submit --dry-run wrote")
    s.set_defaults(func=cmd_run)


def _add_run_commands(sub: argparse._SubParsersAction) -> None:
    """status, logs, cancel, runs: following and stopping runs."""
    s = sub.add_parser("status", help="state of a run or a study, and what to do next "
                       "(default: the newest run, or its study when it is in one)")
    s.add_argument("run", nargs="?", help="run or study: a path, a run id (or its prefix) or "
                                          "a study name (default: the newest run)")
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="where runs live (default: %(default)s)")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("logs", help="a process's log (or the list of logs)")
    s.add_argument("run", help="run or study: a path, a run id (or its prefix) or a study name")
    s.add_argument("process", nargs="?",
                   help="a process name, e.g. decode-0@node01 (default: list the logs)")
    s.add_argument("-f", "--follow", action="store_true",
                   help="keep printing as the log grows, until the run ends")
    s.add_argument("-n", "--lines", type=int, default=40,
                   help="lines from the end to print first (default: %(default)s)")
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="where runs live (default: %(default)s)")
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser(
        "cancel", help="stop a run, or every run of a study (scancel, or signal a local run)")
    s.add_argument("run", help="run or study: a path, a run id (or its prefix) or a study name")
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="where runs live (default: %(default)s)")
    s.set_defaults(func=cmd_cancel)

    s = sub.add_parser("runs", help="list runs")
    s.add_argument("--format", choices=("text", "csv"), default="text",
                   help="a table (default) or CSV for a spreadsheet")
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="where runs live (default: %(default)s)")
    s.set_defaults(func=cmd_runs)


def _add_result_commands(sub: argparse._SubParsersAction) -> None:
    """report, diff, recommend: what a run measured and what to run next."""
    s = sub.add_parser("report", help="write one self-contained HTML report of a run or a study")
    s.add_argument(
        "run", nargs="?",
        help="run or study: a path, a (prefix of a) run id, or a study name (default: newest)",
    )  # fmt: skip
    s.add_argument("-o", "--output", type=Path, default=None,
                   help="where to write it (a file, or a folder for report.html); default: "
                        "report.html in the run or study")
    s.add_argument("--format", choices=("html", "csv"), default="html",
                   help="csv: one row per sweep point, printed (or written to -o)")
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="where runs live (default: %(default)s)")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("diff", help="two runs: settings, processes, fingerprint drift and "
                                    "figures that differ; whether it is single-variable")
    s.add_argument("run_a", help="run directory or id")
    s.add_argument("run_b", help="run directory or id")
    s.add_argument("--format", choices=("text", "json"), default="text",
                   help="text for people (default), json for scripts")
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="where runs live (default: %(default)s)")
    s.set_defaults(func=cmd_diff)

    s = sub.add_parser(
        "recommend", help="the prefill:decode ratio and top concurrency to run next, from one run"
    )
    from launcher.analysis import recommend  # its options' help only

    s.add_argument("run", nargs="?", help="run directory or id, or a study name (default: "
                                          "the newest run)")
    s.add_argument("--target-tok-s-user", type=float, default=None, metavar="X",
                   help=recommend.TARGET_HELP)
    s.add_argument("--target-ttft-ms", type=float, default=None, metavar="MS",
                   help=recommend.TTFT_HELP)
    s.add_argument("--format", choices=("text", "json"), default="text",
                   help=recommend.FORMAT_HELP)
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="where runs live (default: %(default)s)")
    s.set_defaults(func=cmd_recommend)


def _add_service_commands(sub: argparse._SubParsersAction) -> None:
    """prometheus-config, dashboard: what watches the runs."""
    from launcher.telemetry import promconfig  # its arguments only: promsd loads on use

    s = sub.add_parser(
        "prometheus-config",
        help="print a Prometheus scrape config that finds every job (file-based discovery)",
        description="Print a Prometheus scrape job that finds every job's /metrics through "
        "the file-SD targets running jobs write.",
    )  # fmt: skip
    promconfig.add_arguments(s)
    s.set_defaults(func=cmd_prometheus_config)

    s = sub.add_parser("dashboard", help="open the Streamlit dashboard on a runs directory")
    s.add_argument("runs_dir", nargs="?", type=Path, default=DEFAULT_RUNS,
                   help="where runs live (default: %(default)s)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8501, help="port (default: %(default)s)")
    s.set_defaults(func=cmd_dashboard)


def _recipe_options(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set prefill.endpoints=8",
    )  # fmt: skip
    s.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS, help="default ./runs")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        code = args.func(args) or 0
        sys.stdout.flush()  # here, so a reader that went away is caught below
        return code
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # another pipe: a real error
        # `status | head`: the reader has all it wanted. Nothing more may reach the closed
        # pipe, not even the interpreter's last flush.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except UserError as e:
        if e.problems:  # found together: a line each, so every one can be read
            head, each = e.problems
            print(f"error: {_one_line(head)}", *[f"  - {_one_line(p)}" for p in each],
                  sep="\n", file=sys.stderr)
        else:
            print(f"error: {_one_line(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.filename is None:
            raise
        # A path the user gave that the filesystem refuses (too long, not a directory, no
        # permission): the path and the system's reason, not a traceback.
        print(f"error: {_one_line(f'{e.filename}: {e.strerror}')}: check the run name "
              "and --runs-dir", file=sys.stderr)
        return 2


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return True  # stdout itself is unusable: nothing more to say there either


def _one_line(text: str) -> str:
    """A message is one line whatever input it quotes: control characters shown escaped."""
    import re

    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text)


# --- commands ---------------------------------------------------------------------------------


def cmd_recipes(args) -> int:
    from launcher.schema import recipe as rmod

    if args.action == "show":
        if not args.name:
            raise UserError("recipes show NAME: name a shipped recipe or a recipe file")
        print(rmod.dump(rmod.load(args.name, args.overrides, site=args.site)), end="")
        return 0
    if args.action == "import":
        return _import_recipe(args)
    if args.action == "fields":
        from launcher.schema.cluster import Cluster
        from launcher.schema.wording import field_reference

        rows = field_reference(rmod.Recipe)
        site = field_reference(Cluster)
        width = max(len(r[0]) for r in rows + site)
        for path, kind, default, doc in rows:
            print(f"{path:{width}}  {kind:28.28}  {default:20.20}  {doc}".rstrip())
        # what the profile a recipe's `cluster:` names sets for every engine (UCX, NCCL, ...)
        print("\ncluster profile keys (the file a recipe's cluster: names):")
        for path, kind, default, doc in site:
            print(f"{path:{width}}  {kind:28.28}  {default:20.20}  {doc}".rstrip())
        return 0

    rows = [("RECIPE", "MODEL", "SHAPE", "CLUSTER", "ENGINE")]
    for name, path in rmod.shipped().items():
        r = rmod.load(str(path))
        rows.append((name, r.model.path, _shape(r), r.cluster, r.engine))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(f"{v:{w}}" for v, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    print("SHAPE: prefill endpoints x parallelism : decode's. python -m launcher recipes "
          "show NAME: one recipe, every field resolved, its description")
    return 0


def _shape(r) -> str:
    """Endpoints and their parallelism, prefill before decode: "4 x DEP2 : 1 x DEP8"."""
    from launcher.schema.srt_slurm import shape

    def one(pool) -> str:
        return f"{pool.endpoints} x " + shape({"data_parallel": pool.data_parallel,
                                               "tensor_parallel": pool.tensor_parallel,
                                               "pipeline_parallel": pool.pipeline_parallel,
                                               "expert_parallel": pool.expert_parallel})

    if r.mode == "agg":
        return f"agg {one(r.agg)}"
    return f"{one(r.prefill)} : {one(r.decode)}"


def _import_recipe(args) -> int:
    """An srt-slurm recipe as one of ours: the report on stderr, the recipe (checked) out."""
    from launcher.schema import srt_slurm

    if not args.name:
        raise UserError("recipes import FILE: name the srt-slurm recipe file")
    if args.overrides:
        raise UserError("recipes import takes no --set: edit the written recipe, or give "
                        "--set to submit")
    from launcher.schema import srt_slurm_v2

    path = Path(srt_slurm_v2.split_ref(args.name)[0])  # the file, without :override_NAME
    data, report = srt_slurm.import_file(args.name, srt_slurm.parse_aliases(args.alias),
                                         site=srt_slurm.load_site(args.site))
    for line in report.lines():
        print(line, file=sys.stderr)
    text = srt_slurm.render(data, report)
    from launcher.schema import recipe as rmod

    rmod.validate(data, str(path))  # what is written loads as it is
    if args.output:
        out = Path(args.output)
        if out.exists() and out.resolve() == path.resolve():
            raise UserError(f"-o {out} is the source file: write the import elsewhere")
        try:
            out.write_text(text)
        except OSError as e:
            raise UserError(f"cannot write {out}: {e.strerror or e}") from None
        print(f"wrote {out}: python -m launcher submit {out} --dry-run shows its plan",
              file=sys.stderr)
    else:
        print(text, end="")
    return 0


def cmd_submit(args) -> int:
    from launcher.control import prepare

    held = None
    if args.again:
        if args.recipe or args.sweep:
            raise UserError("submit --again RUN takes that run's resolved recipe: give no "
                            "recipe and no --sweep (--set still changes it)")
        old = _find_run(args.runs_dir, args.again)
        args.recipe = [str(old.path / "recipe.yaml")]
        if not Path(args.recipe[0]).is_file():
            raise UserError(f"{old.path} has no recipe.yaml to submit again")
        pin = _pinned_image(old)
        if pin:  # first: a --set of the user's still wins
            args.overrides = [f"container.image={pin}", *(args.overrides or [])]
        held = _not_held(old, pin)
    elif not args.recipe:
        raise UserError("submit needs a recipe (a shipped name or a YAML path), or --again RUN")

    if args.slo is not None:  # JSON is YAML: the limits stay one string
        args.overrides = [*(args.overrides or []), f"benchmark.slo.limits={json.dumps(args.slo)}"]
    from launcher.schema.srt_slurm import parse_aliases

    runs = prepare.prepare_all(
        args.recipe, args.overrides, args.sweep, args.runs_dir, nodelist=args.nodelist,
        allocation=args.allocation, aliases=parse_aliases(args.alias), site=args.site,
    )
    from launcher import text

    if args.format == "json":
        print(json.dumps([text.plan_json(r) for r in runs], indent=2))
    elif len(runs) == 1:
        print(text.plan_text(runs[0]))
    else:
        print(text.study_plan_text(runs))
    if runs:
        from launcher.control import visibility

        # this host's filesystem, once per submission: not part of the plan, so on stderr
        far = visibility.runs_dir_warning(runs[0].plan, args.runs_dir)
        if far:
            print(f"warning: {far}", file=sys.stderr)
    if held:
        print(held, file=sys.stderr)
    if args.dry_run:
        for r in runs:
            sub = r.run.read_submission()
            sub.dry_run, sub.blockers = True, list(r.blockers)
            r.run.write_submission(sub)
        # a blocker is said last and on stderr too; the dry-run itself did what it was asked
        if args.format == "text" and (last := text.not_submittable(runs)):
            print(last)
        for b in dict.fromkeys(b for r in runs for b in r.blockers):
            print(f"{text.BLOCKER}{b}", file=sys.stderr)
        return 0
    from launcher.control import submit

    code = submit.submit_all(runs, check=args.check)
    if args.wait and not args.check:
        from launcher import text
        from launcher.control.runs import wait_job_gone

        # what ran here ended in submit_all; what a scheduler queued is followed here, until
        # Slurm has let go of the job too: the next `submit --wait` may need its nodes
        jobs: dict[str, None] = {}
        for r in runs:
            if job := r.run.read_submission().slurm_job_id:
                code = max(code, text.follow(r.run))
                jobs[job] = None
        shared = runs[0].shared if runs else None
        if shared and (job := runs[0].run.read_submission().slurm_job_id):
            code = max(code, text.follow_study(shared.path, job))
        for job in jobs:
            wait_job_gone(job)
    return code


def _identity(run) -> dict:
    rec = run.read_record()
    return (rec.identity if rec else None) or {}


def _is_tag(image: str | None) -> bool:
    """A registry image named by a tag, whose bytes the registry may change."""
    return bool(image) and "@sha256:" not in image and not image.startswith("/")


def _pinned_image(old) -> str | None:
    """`old`'s image pinned to the digest it ran, when it ran a tag whose digest is known."""
    ident = _identity(old)
    image, digest = ident.get("image"), ident.get("image_digest")
    return f"{image}@{digest}" if digest and _is_tag(image) else None


def _not_held(old, pin: str | None = None) -> str:
    """What a re-run cannot hold the same as `old`, in one sentence."""
    ident = _identity(old)
    parts = []
    image = ident.get("image")
    if pin:
        parts.append(f"the image is pinned to the digest that run used: {pin}")
    elif _is_tag(image):
        parts.append(f"the image {image} is a tag the registry may serve other bytes for "
                     "now, and that run recorded no digest for it (pin it with --set "
                     "container.image=REPO@sha256:...)")
    if ident.get("nodes"):
        parts.append(f"the nodes are the scheduler's choice (it ran on "
                     f"{', '.join(ident['nodes'])})")
    if ident.get("driver"):
        parts.append(f"the driver is what those nodes have now (it had {', '.join(ident['driver'])})")
    parts.append(f"`python -m launcher diff {old.path} NEW_RUN` names any drift once it ran")
    return "again: " + "; ".join(parts)


def cmd_env(args) -> int:
    from launcher.control import compute_env
    from launcher.schema import cluster as cluster_mod
    from launcher.schema.sections import AIPERF_VERSION

    c = cluster_mod.load(args.cluster)
    rt = compute_env.runtime(c, args.runs_dir)
    if args.action == "prepare":
        rt = compute_env.prepare(c, args.runs_dir)
        if args.aiperf:
            compute_env.prepare_aiperf(c, args.runs_dir)
    print(f"{c.name}: launcher programs run {compute_env.describe(rt)}")
    if rt.aiperf_env:
        print(f"{c.name}: AIPerf {AIPERF_VERSION} (benchmark.agentic) " + (
            f"staged in {rt.aiperf_env}" if compute_env.aiperf_staged(rt) else
            f"not staged: python -m launcher env prepare --cluster {args.cluster} --aiperf"))
    why = compute_env.check_ready(rt)
    if why:
        print(f"not ready: {why}")
        return 1
    return 0


def cmd_stage_model(args) -> int:
    from launcher.control import staging
    from launcher.schema import cluster as cluster_mod

    c = cluster_mod.load(args.cluster)
    if not c.models.hf_home:
        raise UserError(f"cluster profile {c.name} names no models.hf_home to stage into")
    return staging.main([args.model, "--hf-home", c.models.hf_home] +
                        (["--revision", args.revision] if args.revision else []))


def cmd_stage_dataset(args) -> int:
    from launcher.control import datasets
    from launcher.schema import cluster as cluster_mod

    c = cluster_mod.load(args.cluster)
    where = datasets.stage(args.trace, c, args.runs_dir.resolve(), args.block_size)
    print(f"staged {args.trace} at {where}")
    if args.trace not in datasets.AGENTIC_CORPORA:
        print(f"set benchmark.agentic.trace: {where}")
    return 0


def cmd_run(args) -> int:
    from launcher.run import listing

    if listing.is_study(args.run_dir):
        from launcher.control import study

        return study.run_study(args.run_dir.resolve())
    from launcher.control import orchestrator

    return orchestrator.run(args.run_dir.resolve())


def _find_run(runs_dir: Path, ref: str | None):
    from launcher.control import runs as runs_mod

    return runs_mod.find(runs_dir, ref)


def cmd_status(args) -> int:
    from launcher import text
    from launcher.control import runs as runs_mod
    from launcher.run import listing

    study = runs_mod.find_study(args.runs_dir, args.run)
    run = None
    if study is None:
        run = _find_run(args.runs_dir, args.run)
        if not args.run:  # the newest thing: its study, when the newest run is in one
            study = listing.study_of(run)
    if study is not None:
        statuses = {str(r.path): runs_mod.reconcile(r) for r in study.runs}
        print(text.study_status_text(study, statuses, args.runs_dir,
                                     runs_mod.allocation_live(study)))
        return 0
    st = runs_mod.reconcile(run)
    slurm = runs_mod.slurm_state(st.slurm_job_id) if st.slurm_job_id else None
    in_study = listing.study_of(run)
    live = runs_mod.allocation_live(in_study) if in_study is not None else None
    print(text.status_text(run, st, slurm, live if live and live[0] is not None else None))
    return 0


def cmd_logs(args) -> int:
    from launcher.control import runs as runs_mod

    study = runs_mod.find_study(args.runs_dir, args.run)
    if study is not None:
        if args.follow:
            raise UserError(f"{study.name} is a study of {len(study.runs)} runs: follow one "
                            f"of them ({', '.join(r.run_id for r in study.runs[:4])})")
        for why in study.problems():  # its own files, damaged: its runs' logs are apart
            print(f"warning: {why}")
        code = 0
        for r in study.runs:
            print(f"== {r.run_id}")
            code = max(code, runs_mod.show_logs(r, args.process, False, args.lines))
        return code
    return runs_mod.show_logs(
        _find_run(args.runs_dir, args.run), args.process, args.follow, args.lines
    )


def cmd_cancel(args) -> int:
    from launcher.control import runs as runs_mod

    study = runs_mod.find_study(args.runs_dir, args.run)
    if study is not None:
        return runs_mod.cancel_study(study)
    return runs_mod.cancel(_find_run(args.runs_dir, args.run))


def cmd_runs(args) -> int:
    from launcher import text
    from launcher.control import runs as runs_mod
    from launcher.run import listing

    entries = listing.entries(args.runs_dir)
    statuses = {str(r.path): runs_mod.reconcile(r) for r in listing.all_runs(args.runs_dir)}
    if args.format == "csv":
        import csv

        rows = text.runs_rows(entries, statuses)
        w = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]) if rows else ["run"])
        w.writeheader()
        w.writerows(rows)
        return 0
    print(text.runs_text(entries, statuses, args.runs_dir))
    return 0


def cmd_report(args) -> int:
    """Writes <run or study>/report.html and prints its path."""
    from launcher import report
    from launcher.run import listing

    ref = args.run
    if ref and listing.is_study(Path(ref)):
        path = Path(ref)
    elif ref and listing.is_study(args.runs_dir / ref):
        path = args.runs_dir / ref
    else:
        path = _find_run(args.runs_dir, ref).path
    if args.format == "csv":
        text = report.results_csv(path)
        if args.output is None:
            sys.stdout.write(text)
        else:
            from launcher.run.rundir import write_atomic

            write_atomic(args.output, text)
            print(args.output)
        return 0
    print(report.write_report(path, args.output))
    return 0


def cmd_diff(args) -> int:
    from launcher.analysis import compare

    a, b = _find_run(args.runs_dir, args.run_a), _find_run(args.runs_dir, args.run_b)
    result = compare.compare(a.path, b.path, compare.pool(args.runs_dir, a.path, b.path))
    if args.format == "json":
        import json

        print(json.dumps(result, indent=1, default=str))
    else:
        print(compare.text(result))
    return 0


def cmd_recommend(args) -> int:
    from launcher.analysis import recommend
    from launcher.control import runs as runs_mod

    study = runs_mod.find_study(args.runs_dir, args.run)
    if study is not None and not study.runs:
        raise UserError(f"study {study.name} has no runs to recommend from")
    # a study's recommendation reads all of its runs from any one of them: under an SLO,
    # the run of the configuration its answer names
    run = study.runs[0] if study is not None else _find_run(args.runs_dir, args.run)
    if study is not None:
        from launcher.analysis.recommend import slo_of

        named = (slo_of(run.path) or {}).get("best_run")
        run = next((r for r in study.runs if r.run_id == named), run)
    argv = [str(run.path), "--format", args.format]
    if args.target_tok_s_user is not None:
        argv += ["--target-tok-s-user", str(args.target_tok_s_user)]
    if args.target_ttft_ms is not None:
        argv += ["--target-ttft-ms", str(args.target_ttft_ms)]
    return recommend.main(argv)


def cmd_prometheus_config(args) -> int:
    from launcher.telemetry import promsd

    return promsd.run(args)


def cmd_dashboard(args) -> int:
    import dashboard

    if not args.runs_dir.is_dir():
        raise UserError(f"runs directory {args.runs_dir} does not exist: run a recipe first")
    os.environ.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    return dashboard.serve(args.runs_dir.resolve(), host=args.host, port=args.port)
