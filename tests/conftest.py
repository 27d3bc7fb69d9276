import os
import re
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@pytest.fixture
def cli(tmp_path):
    """Run `python -m launcher ...` as a user would; returns (exit code, stdout, stderr)."""
    import subprocess

    def run(*args, env=None, timeout=120):
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.run(
            [sys.executable, "-m", "launcher", *args],
            capture_output=True, text=True, cwd=tmp_path, env=e, timeout=timeout,
        )  # fmt: skip
        return p.returncode, p.stdout, p.stderr

    return run


# --- tests in parallel (pytest-xdist, `make test` runs `-n 3 --dist loadgroup`) ----------
# Most of the suite waits on processes and timers, so a few workers share the 2 cores. What
# tests share decides who runs with whom. The dev cluster's tests run in two lanes, first
# (the longest groups), each on one worker in turn and each on its own partition of the dev
# cluster (slurm/devcluster/up.sh: `dev`, `dev2`, 6 nodes each): what a lane's tests submit
# goes there (SBATCH_PARTITION and its salloc/srun twins, which Slurm reads over #SBATCH
# lines), so a test that kills or drains a node or waits for every node idle
# (`@pytest.mark.whole_partition`) disturbs only its own lane, which runs one test at a time
# anyway; that includes a test that kills an srun (Slurm's messages for its step could end
# another srun of the partition: docs/contracts.md; each partition's sruns have ports of their
# own). A test that takes something from every node (enroot) runs with no other dev-cluster
# test beside it (`@pytest.mark.whole_cluster`). Any other test runs
# with its module, whose module fixtures then start once. Local runs keep apart by themselves
# (each holds its own block of ports).
DEVCLUSTER = "devcluster"
PARTITIONS = ("dev", "dev2")  # the lanes' partitions, in the order their locks are taken
# the second lane's modules: about half the dev cluster's time
SECOND_LANE = {"test_slurm_run", "test_pyxis", "test_rack_faults", "test_srt_devcluster",
               "test_prometheus", "test_gb200_path", "test_salloc"}
PARTITION_ENV = ("SBATCH_PARTITION", "SALLOC_PARTITION", "SLURM_PARTITION")
DEVCLUSTER_DIR = Path(os.environ.get("DEVCLUSTER_DIR", "/var/tmp/pd-devcluster"))
# After the lanes, the modules the timing table names longest start first, longest first
# (`make test` passes --no-loadscope-reorder, which keeps this order instead of xdist's by
# number of tests): one started last would run alone while the other workers stand idle.
LONGEST_FIRST = ("test_vllm_cpu", "test_dashboard_browser", "test_workload",
                 "test_newcomer_cli", "test_slo_study", "test_local_run", "test_preflight",
                 "test_vllm_cpu_kv_tiers", "test_fuzz", "test_agentic")


def lane_partition(module_name: str) -> str:
    return PARTITIONS[1] if module_name in SECOND_LANE else PARTITIONS[0]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = item.module.__name__
        if item.get_closest_marker("slurm"):
            group = DEVCLUSTER + ("-2" if group in SECOND_LANE else "")
        item.add_marker(pytest.mark.xdist_group(group))
    def order(item) -> int:
        if item.get_closest_marker("slurm"):
            return 0
        name = item.module.__name__
        return 1 + (LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST))

    items.sort(key=order)  # stable: the collection's order within each


@contextmanager
def _held(gate_path: Path, lock_path: Path, alone: bool):
    """`lock_path` held shared, or alone (exclusive); a turnstile keeps new holders from
    slipping in while one waits to be alone."""
    import fcntl

    with open(gate_path, "a") as gate, open(lock_path, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield


@contextmanager
def _on_partition(root: Path, part: str, whole_partition: bool, whole_cluster: bool):
    """The dev cluster's partition `part` taken (shared, or alone), every partition alone for
    a whole-cluster test (always in one order: no two wait on each other), and what is
    submitted meanwhile sent to `part`: by the environment for the second lane; the first
    lane's is the default partition, where a test naming slurm.partition gets that one."""
    with ExitStack() as held:
        for p in PARTITIONS if whole_cluster else (part,):
            held.enter_context(_held(root / f"devcluster-{p}.turnstile",
                                     root / f"devcluster-{p}.lock",
                                     whole_cluster or whole_partition))
        env = held.enter_context(pytest.MonkeyPatch.context())
        if part != PARTITIONS[0]:
            for k in PARTITION_ENV:
                env.setenv(k, part)
            # its own srun ports for an srun started here (in its jobs, its nodes' slurmd
            # says so): up.sh writes one config per partition
            conf = DEVCLUSTER_DIR / "etc" / f"slurm.{part}.conf"
            if conf.exists():
                env.setenv("SLURM_CONF", str(conf))
        yield


# A test that asserts how long something takes (`@pytest.mark.alone`) runs with no other
# test beside it: `make test` runs them after the rest, one at a time; within one parallel
# run they take the CPU's lock alone. A dev-cluster module's fixtures take their partition's
# lock while they set up (below). The dev cluster's locks are taken before the CPU's, always,
# so no two tests wait on each other.
@pytest.fixture(autouse=True)
def _cpu_to_itself(request, tmp_path_factory):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import simprocs

    on_cluster = request.node.get_closest_marker("slurm") is not None
    simprocs.ON_DEVCLUSTER[0] = on_cluster
    root = tmp_path_factory.getbasetemp().parent  # the session's, shared by its workers
    import time

    t0 = time.monotonic()
    with ExitStack() as held:
        if on_cluster:
            marked = request.node.get_closest_marker
            held.enter_context(_on_partition(root, lane_partition(request.module.__name__),
                                             marked("whole_partition") is not None,
                                             marked("whole_cluster") is not None))
        alone = request.node.get_closest_marker("alone") is not None
        held.enter_context(_held(root / "cpu.turnstile", root / "cpu.lock", alone))
        # a wait here is a worker idle, not a test working: the timing table tells them apart
        request.node.user_properties.append(("waited_s", time.monotonic() - t0))
        _HOLDING[0] = True
        try:
            yield
        finally:
            _HOLDING[0] = False


_HOLDING = [False]  # this worker's test holds the locks (a fixture set up inside it: no more)


# A module fixture that dev-cluster tests read (a run several of them check) submits jobs
# too: it takes its partition's lock, shared, while it sets up, so it never starts beside a
# test that has the partition or the cluster to itself (enroot taken away, a node killed) and
# fails or wedges its job, and its jobs go to that partition. A module fixture only other
# tests use waits for nobody.
@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope != "module" or not os.environ.get("PYTEST_XDIST_WORKER") or \
            _HOLDING[0] or not any(
            item.get_closest_marker("slurm") for item in request.session.items
            if item.module is request.module and fixturedef.argname in item.fixturenames):
        return (yield)
    import time

    root = request.config._tmp_path_factory.getbasetemp().parent
    t0 = time.monotonic()
    with _on_partition(root, lane_partition(request.module.__name__), False, False):
        request._pyfuncitem.user_properties.append(("waited_s", time.monotonic() - t0))
        return (yield)


# --- Streamlit's scan of the installed packages, once per process -------------------------
# Every AppTest scans every installed distribution's metadata for components (0.25 s each,
# about a fifth of a page test): the environment does not change within a session, so one
# scan serves them all. Should Streamlit move the scan, the tests only go slower.
def _streamlit_scan_once() -> None:
    import functools

    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:
        return
    scan = getattr(manifest_scanner, "scan_component_manifests", None)
    if scan is not None and not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.lru_cache(maxsize=1)(scan)


# --- real vLLM for CPU: NIXL's pollers capped together -----------------------------------------
# Every NIXL engine of vLLM for CPU has a thread that busy-polls UCX for the engine's whole life,
# idle or serving: one core per engine (docs/vllm-cpu.md). Nice does not tame it: each run's
# processes are a session of their own, and with the kernel's autogroups (on by default) a nice
# value weighs only against the same session's threads, so a niced poller still takes its
# session's full share of the machine. The session therefore moves every such thread into one
# CPU cgroup capped at a fifth of a core for all of them together; the polls still come every
# few tens of milliseconds, so transfers go on. A poller is a thread that has wanted a core
# (running or waiting to run: the kernel's schedstat) for POLLER_SECONDS seconds in a row
# without ever blocking (its voluntary context switches): a poll with a timeout of 0 never
# sleeps, while a thread that works, such as NIXL's handshake in Python, waits for the GIL or
# a lock every few milliseconds. Capping such a worker too starved it: a hybrid model's
# handshake took 13 s to add the remote agent (0.09 s alone) and its first transfer 71 s,
# the decode spinning meanwhile (docs/vllm-cpu.md). Where no cgroup can be made (no cpu
# controller, not root), the thread is niced, which still helps within its own session. Only
# a worker's threads other than its main one are touched, and only from the session's process.
POLLER_CORE_SHARE = 0.8
POLLER_SECONDS = 3
POLLER_MAX_BLOCKS = 2  # voluntary context switches a second that still count as never blocking
POLLERS_CAP_US = (10_000, 50_000)  # CPU time per period, for all the pollers together


_POLLERS: list[tuple[Path, Path] | None] = [None]  # the session's cgroup for them, if any


def _pollers_cgroup(owner: int | None = None) -> tuple[Path, Path] | None:
    """A new CPU cgroup capped at POLLERS_CAP_US, named after the process `owner` (this one):
    (its folder, the file a thread id is written to); None where none can be made."""
    quota, period = POLLERS_CAP_US
    name = f"pd-tests-nixl-pollers-{owner or os.getpid()}"
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    for stale in [*v1.glob("pd-tests-nixl-pollers-*"), *v2.glob("pd-tests-nixl-pollers-*")]:
        if not Path(f"/proc/{stale.name.rsplit('-', 1)[1]}").exists():
            try:  # an earlier session's, ended without its cleanup; empty once its engines are
                stale.rmdir()
            except OSError:
                pass
    try:
        if (v1 / "cpu.cfs_quota_us").is_file():
            g = v1 / name
            g.mkdir(exist_ok=True)
            (g / "cpu.cfs_period_us").write_text(str(period))
            (g / "cpu.cfs_quota_us").write_text(str(quota))
            return g, g / "tasks"
        if "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
            g = v2 / name
            g.mkdir(exist_ok=True)
            (g / "cgroup.type").write_text("threaded")
            (g / "cpu.max").write_text(f"{quota} {period}")
            return g, g / "cgroup.threads"
    except OSError:
        pass
    return None


def _cgroup_stat(folder: Path) -> dict[str, int]:
    """A cgroup's cpu.stat: nr_periods, nr_throttled, throttled_time (ns, v1) or
    throttled_usec (v2)."""
    return {k: int(v) for k, v in (line.split() for line in
                                   (folder / "cpu.stat").read_text().splitlines())}


def _pollers_release(group: tuple[Path, Path] | None) -> None:
    """The cgroup removed, any thread still in it handed back to its parent first."""
    if group is None:
        return
    folder, threads = group
    try:
        for tid in threads.read_text().split():
            try:
                (folder.parent / threads.name).write_text(tid)
            except OSError:
                pass
        folder.rmdir()
    except OSError:
        pass


def _tame(tid: int, group: tuple[Path, Path] | None) -> bool:
    """Thread `tid` into the group, else to nice 19; False when neither could be done (it has
    ended, or this process may not)."""
    if group is not None:
        try:
            group[1].write_text(str(tid))
            return True
        except OSError:
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 19)
        return True
    except OSError:
        return False


def _thread_load(pid: int, tid: int) -> tuple[int, int]:
    """Thread `tid`'s ns run or waited to run, and its voluntary context switches, so far."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        ran, waited = f.read().split()[:2]
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        blocks = next(int(line.split()[1]) for line in f
                      if line.startswith("voluntary_ctxt_switches:"))
    return int(ran) + int(waited), blocks


def _nixl_pollers_capped(stop, group: tuple[Path, Path] | None,
                         process: str = "VLLM::Worker") -> None:
    import time

    seen: dict[int, tuple[int, int]] = {}  # tid -> its load at the last look
    spun: dict[int, int] = {}  # tid -> seconds in a row it spun without blocking
    moved: set[int] = set()
    last = time.monotonic()
    while not stop.wait(1.0):
        now, loads = time.monotonic(), {}
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != process:
                        continue
                for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task")):
                    if tid != pid and tid not in moved:
                        loads[tid] = _thread_load(pid, tid)
            except (OSError, ValueError, StopIteration):
                continue
        spinning = {}
        for tid, (ns, blocks) in loads.items():
            if tid in seen and ns - seen[tid][0] >= POLLER_CORE_SHARE * (now - last) * 1e9 \
                    and blocks - seen[tid][1] <= POLLER_MAX_BLOCKS * (now - last):
                spinning[tid] = spun.get(tid, 0) + 1
                if spinning[tid] >= POLLER_SECONDS and _tame(tid, group):
                    moved.add(tid)
        seen, spun, last = loads, spinning, now


def pytest_sessionstart(session):
    if os.environ.get("PYTEST_XDIST_WORKER") or not os.path.isdir("/proc"):
        return
    import threading

    stop = threading.Event()
    group = _POLLERS[0] = _pollers_cgroup()
    t = threading.Thread(target=_nixl_pollers_capped, args=(stop, group), daemon=True,
                         name="nixl-pollers-capped")
    t.start()

    def end() -> None:
        stop.set()
        t.join(5)
        _pollers_release(group)

    session.config.add_cleanup(end)


# --- the suite measures itself --------------------------------------------------------------
# At the end of every run: the slowest tests and modules with their share of the wall time
# (setup + call + teardown; a module fixture's end-to-end run is charged to its first test).
_TIMES: dict[str, float] = {}
_T0: list[float] = []
_CPU0: list[tuple[int, int]] = []


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of every core since boot, from /proc/stat (the machine's:
    slurmd, engines and browsers included); None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def pytest_configure(config):
    import time

    _T0.append(time.monotonic())
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", 0):
        _streamlit_scan_once()  # where tests run: not in pytest-xdist's controller
    if not os.environ.get("PYTEST_XDIST_WORKER") and (t := _cpu_ticks()):
        _CPU0.append(t)


_WORKERS: dict[str, float] = {}  # pytest-xdist worker -> seconds inside its tests
_WAITED: dict[str, float] = {}  # test -> seconds its worker waited for the tests' locks
_CPU: dict[str, float] = {}  # test -> CPU seconds of its worker and the children it reaped


def _own_cpu() -> float:
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# The CPU a test costs where it can be counted: its worker's and that of the processes it ran
# and waited for (a local run's engines, a CLI call); not what runs under slurmd or a browser.
# One wrapper for the three phases (pytest passes each hook only the arguments it names).
@pytest.hookimpl(wrapper=True)
def _cpu_counted(item):
    t0 = _own_cpu()
    try:
        return (yield)
    finally:
        item.user_properties.append(("cpu_s", _own_cpu() - t0))


pytest_runtest_setup = pytest_runtest_call = pytest_runtest_teardown = _cpu_counted


def pytest_runtest_logreport(report):
    nodeid = report.nodeid.split("@", 1)[0]  # loadgroup's "@group" suffix
    _TIMES[nodeid] = _TIMES.get(nodeid, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if worker is not None:
        _WORKERS[worker.id] = _WORKERS.get(worker.id, 0.0) + report.duration
    if report.when == "teardown":  # its properties hold every phase's
        _CPU[nodeid] = sum(v for k, v in report.user_properties if k == "cpu_s")
    if report.when == "setup":
        waited = [v for k, v in report.user_properties if k == "waited_s"]
        if waited:
            _WAITED[nodeid] = sum(waited)


def _by_module(per_test: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for nodeid, sec in per_test.items():
        mod = nodeid.split("::")[0]
        out[mod] = out.get(mod, 0.0) + sec
    return out


def pytest_terminal_summary(terminalreporter):
    import time

    if not _TIMES or not _T0:
        return
    wall = time.monotonic() - _T0[0]
    tests = sorted(_TIMES.items(), key=lambda kv: -kv[1])
    modules = _by_module(_TIMES)
    w = terminalreporter.write_line
    w("")
    inside = sum(_TIMES.values())
    w(f"suite timing: {len(_TIMES)} tests in {wall:.0f} s wall ({wall / 60:.1f} min); "
      f"{inside:.0f} s inside tests")
    if _WORKERS:
        busy = ", ".join(f"{k} {v:.0f} s ({100 * v / wall:.0f} %)" for k, v in sorted(_WORKERS.items()))
        w(f"in parallel: {len(_WORKERS)} workers, {inside / wall:.2f} test-seconds per wall "
          f"second; each worker's time inside tests: {busy}")
    if _WAITED:
        waited = sum(_WAITED.values())
        top = sorted(_WAITED.items(), key=lambda kv: -kv[1])[:3]
        w(f"waiting for the tests' locks (alone, whole_partition, whole_cluster), of the time "
          f"inside tests: {waited:.0f} s, most before "
          + ", ".join(f"{n.split('::')[-1]} ({v:.0f} s)" for n, v in top))
    if _CPU0 and (t := _cpu_ticks()) and t[1] > _CPU0[0][1]:
        # near all cores busy: more workers would only queue; well below: they would help
        cores = os.cpu_count() or 1
        share = (t[0] - _CPU0[0][0]) / (t[1] - _CPU0[0][1])
        w(f"cores busy: {share * cores:.1f} of {cores} on average ({100 * share:.0f} %, the "
          f"whole machine's)")
    if (group := _POLLERS[0]) is not None:
        try:
            stat = _cgroup_stat(group[0])
            held_s = (stat.get("throttled_time", 0) or stat.get("throttled_usec", 0) * 1000) / 1e9
            w(f"NIXL pollers capped ({POLLERS_CAP_US[0] // 1000} ms per "
              f"{POLLERS_CAP_US[1] // 1000} ms, all together): held back {held_s:.0f} s in "
              f"{stat.get('nr_throttled')} of {stat.get('nr_periods')} periods")
        except (OSError, ValueError):
            pass
    cpu_by_module = _by_module(_CPU)
    if _CPU:
        w(f"CPU counted in the tests (their workers and the processes they waited for): "
          f"{sum(_CPU.values()):.0f} s")
    w("slowest modules (share of the wall time; CPU counted in them):")
    for mod, sec in sorted(modules.items(), key=lambda kv: -kv[1])[:12]:
        w(f"  {sec:7.1f} s  {100 * sec / wall:5.1f} %  {cpu_by_module.get(mod, 0.0):6.0f} s CPU  {mod}")
    w("slowest tests:")
    for nodeid, sec in tests[:15]:
        w(f"  {sec:7.1f} s  {100 * sec / wall:5.1f} %  {nodeid}")
    # every test's time, for comparing runs: .pytest_cache/timing.tsv (seconds, node id,
    # CPU seconds counted),
    # timing-alone.tsv for `make test`'s second run (-m alone)
    cache = Path(terminalreporter.config.rootpath) / ".pytest_cache"
    marks = re.sub(r"\W+", "-", terminalreporter.config.option.markexpr or "").strip("-")
    name = "timing.tsv" if marks in ("", "not-alone") else f"timing-{marks}.tsv"
    if cache.is_dir():
        (cache / name).write_text("".join(f"{s:.2f}\t{n}\t{_CPU.get(n, 0.0):.2f}\n"
                                          for n, s in tests))
