"""The telemetry store: crash safety, readability while written, compaction, filters and the
change-point rule that readers rely on."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from launcher.telemetry.store import (
    ChangeFilter,
    SampleWriter,
    compact_segment,
    read_agent_info,
    read_gaps,
    read_raw,
    read_samples,
    write_agent_info,
)

REPO = Path(__file__).resolve().parents[1]


def _rows(node: str, t0: float, n: int) -> list[tuple]:
    rows = []
    for i in range(n):
        ts = t0 + i
        rows.append((ts, node, "decode-0@n1", "0", "vllm:kv_cache_usage_perc",
                     {"model_name": "m"}, i / 100))
        rows.append((ts, node, "decode-0@n1", "1", "vllm:num_requests_running",
                     {"model_name": "m"}, float(i)))
        rows.append((ts, node, "", "", "gpu:power_w", {"uuid": "GPU-x", "index": "0"}, 100.0 + i))
    return rows


def test_readable_while_being_written_and_torn_tail_is_skipped(tmp_path: Path) -> None:
    node_dir = tmp_path / "telemetry" / "n1"
    w = SampleWriter(node_dir)
    w.write(_rows("n1", 1000.0, 5))
    w.flush()
    df = read_samples(tmp_path)
    assert len(df) == 15
    assert list(df.columns) == ["ts", "node", "process", "engine", "name", "labels", "value"]
    kv = df[df.name == "vllm:kv_cache_usage_perc"]
    assert kv.value.tolist() == [0.0, 0.01, 0.02, 0.03, 0.04]
    assert set(kv.engine) == {"0"}
    gpu = df[df.name == "gpu:power_w"]
    assert set(gpu.engine) == {""} and set(gpu.process) == {""}
    assert json.loads(gpu.labels.iloc[0]) == {"index": "0", "uuid": "GPU-x"}
    assert gpu.labels.iloc[0] == '{"index":"0","uuid":"GPU-x"}'  # canonical
    # a killed writer leaves a torn line; a damaged line in the middle is skipped too
    seg = next(node_dir.glob("samples-*.tsv"))
    with open(seg, "ab") as f:
        f.write(b"garbage without enough columns\n")
        f.write(b"1005.000\tn1\tp\t\tx\t{}\tnot-a-float\n")
        f.write(b"1006.000\tn1\tdecode-0@n1\t0\tvllm:kv_cache_usage_perc\t{}\t0.5")  # torn
    w.write(_rows("n1", 2000.0, 1))  # never flushed: invisible, as documented
    df2 = read_samples(tmp_path)
    assert len(df2) == 15
    w.close()


def test_rotation_compacts_to_parquet_and_filters_push_down(tmp_path: Path) -> None:
    node_dir = tmp_path / "telemetry" / "n1"
    w = SampleWriter(node_dir, rotate_bytes=2000)
    for k in range(6):
        w.write(_rows("n1", 1000.0 + 10 * k, 10))
        w.flush()
    w.close()
    assert not list(node_dir.glob("samples-*.tsv")), "a clean close leaves only parquet"
    parquets = list(node_dir.glob("samples-*.parquet"))
    assert len(parquets) >= 3
    df = read_samples(tmp_path)
    assert len(df) == 180
    assert df.ts.is_monotonic_increasing
    only = read_samples(tmp_path, names=["gpu:power_w"])
    assert set(only.name) == {"gpu:power_w"} and len(only) == 60
    pref = read_samples(tmp_path, name_prefix="vllm:")
    assert set(pref.name) == {"vllm:kv_cache_usage_perc", "vllm:num_requests_running"}
    win = read_samples(tmp_path, names=["gpu:power_w"], start=1010, end=1019.5,
                       state_at_start=False)
    assert win.ts.tolist() == [float(t) for t in range(1010, 1020)]
    procs = read_samples(tmp_path, processes=["decode-0@n1"])
    assert set(procs.process) == {"decode-0@n1"} and len(procs) == 120
    assert read_samples(tmp_path, nodes=["other"]).empty


def test_a_segment_under_the_threshold_stays_text_and_one_at_it_is_compacted(
        tmp_path: Path) -> None:
    """`compact_min_bytes` (the agent's: short runs stay text): at close and at rotation,
    a smaller segment is left as text, one of that size or more becomes parquet; both read
    back the same rows, and a killed writer's orphans follow the same rule."""
    rows = _rows("n1", 1000.0, 10)
    small = tmp_path / "small" / "telemetry" / "n1"
    w = SampleWriter(small, compact_min_bytes=10**6)
    w.write(rows)
    w.close()
    (seg,) = small.glob("samples-*")
    assert seg.suffix == ".tsv" and seg.stat().st_size < 10**6
    big = tmp_path / "big" / "telemetry" / "n1"
    w = SampleWriter(big, compact_min_bytes=seg.stat().st_size)  # exactly its size
    w.write(rows)
    w.close()
    assert [p.suffix for p in big.glob("samples-*")] == [".parquet"]
    a, b = (sorted(read_samples(tmp_path / d).itertuples(index=False)) for d in ("small", "big"))
    assert len(a) == 30 and a == b  # the same rows (parquet orders ties by name)
    # rotation: each rotated segment is judged alone (2 kB segments, threshold between)
    rot = tmp_path / "rot" / "telemetry" / "n1"
    w = SampleWriter(rot, rotate_bytes=2000, compact_min_bytes=1500)
    for k in range(6):
        w.write(_rows("n1", 1000.0 + 10 * k, 10))
        w.flush()
    w.close()
    segs = sorted(rot.glob("samples-*"), key=lambda p: p.stem)  # by start time
    assert len(segs) >= 3 and all(p.suffix == ".parquet" for p in segs[:-1]), segs  # >= 2 kB
    assert segs[-1].suffix == ".parquet" or segs[-1].stat().st_size < 1500, segs[-1]
    assert len(read_samples(tmp_path / "rot")) == 180
    # orphans of a killed writer: the next writer compacts only those worth it
    orphan = small / "samples-0000000000001-999.tsv"
    orphan.write_bytes(seg.read_bytes())
    empty = small / "samples-0000000000002-999.tsv"
    empty.write_bytes(b"")
    w = SampleWriter(small, compact_min_bytes=10**6)
    w.close()
    assert orphan.exists() and not orphan.with_suffix(".parquet").exists()
    assert not empty.exists() and not empty.with_suffix(".parquet").exists()  # as compaction did


def test_state_at_start_gives_each_series_its_value_at_the_window_start(tmp_path: Path) -> None:
    w = SampleWriter(tmp_path / "telemetry" / "n1")
    w.write([(100.0, "n1", "p", "0", "a", {}, 1.0), (150.0, "n1", "p", "0", "a", {}, 2.0),
             (120.0, "n1", "p", "0", "b", {}, 7.0), (200.0, "n1", "p", "0", "b", {}, 8.0)])
    w.close()
    df = read_samples(tmp_path, start=160, end=300)
    a = df[df.name == "a"]
    assert a.value.tolist() == [2.0] and a.ts.tolist() == [150.0]
    b = df[df.name == "b"]
    assert b.value.tolist() == [7.0, 8.0]


def test_change_filter_rows_reproduce_every_sample_by_interpolation() -> None:
    rng = random.Random(7)
    f = ChangeFilter(keyframe_s=25.0)
    truth: dict[str, list[tuple[float, float]]] = {"flat": [], "steps": [], "noisy": [],
                                                   "counter": []}
    stored: dict[str, list[tuple[float, float]]] = {k: [] for k in truth}
    c = 0.0
    for i in range(200):
        ts = 1000.0 + i
        if rng.random() < 0.1:
            c += rng.randint(1, 5)
        vals = {"flat": 3.0, "steps": float(i // 37), "noisy": rng.random(), "counter": c}
        for k, v in vals.items():
            truth[k].append((ts, v))
        for t, k, v in f.step(ts, vals.items()):
            stored[k].append((t, v))
    for t, k, v in f.pending():
        stored[k].append((t, v))
    for k, samples in truth.items():
        st = sorted(stored[k])
        xs, ys = np.array([t for t, _ in st]), np.array([v for _, v in st])
        tx = np.array([t for t, _ in samples])
        ty = np.array([v for _, v in samples])
        assert np.allclose(np.interp(tx, xs, ys), ty), k
    # and it actually saves rows: the flat series keeps its ends plus keyframes only
    assert len(stored["flat"]) <= 2 + 200 / 25 + 1
    assert len(stored["counter"]) < 120
    assert len(stored["noisy"]) == 200


def test_gaps_pair_open_and_close_and_agent_info(tmp_path: Path) -> None:
    nd = tmp_path / "telemetry" / "n1"
    w = SampleWriter(nd)
    w.gap(ts=10.0, node="n1", process="decode-0@n1", source="scrape",
          target="http://127.0.0.1:1/metrics", reason="connection refused")
    w.gap(ts=11.0, node="n1", process="decode-0@n1", source="scrape",
          target="http://127.0.0.1:1/metrics", reason="connection refused")
    w.gap(ts=14.0, node="n1", process="decode-0@n1", source="scrape",
          target="http://127.0.0.1:1/metrics", reason="ok again", state="closed")
    w.gap(ts=20.0, node="n1", process="prefill-0@n1", source="scrape",
          target="http://127.0.0.1:2/metrics", reason="timeout after 0.5 s")
    w.close()
    with open(nd / "gaps.jsonl", "a") as f:
        f.write('{"ts": 30, "node": "n1", "proc')  # torn
    g = read_gaps(tmp_path)
    assert len(g) == 2
    first = g.iloc[0]
    assert (first.process, first.start, first.end, first.reason, first.failures) == (
        "decode-0@n1", 10.0, 14.0, "connection refused", 2)
    assert g.iloc[1].reason == "timeout after 0.5 s" and np.isnan(g.iloc[1].end)
    write_agent_info(nd, {"node": "n1", "notices": ["no NVML: libnvidia-ml.so.1 not found"]})
    info = read_agent_info(tmp_path)
    assert info["n1"]["notices"][0].startswith("no NVML")


def test_raw_text_round_trip_and_torn_record(tmp_path: Path) -> None:
    nd = tmp_path / "telemetry" / "n1"
    w = SampleWriter(nd)
    w.write_raw(5.0, "decode-0@n1", "vllm:a 1\n" * 100)
    w.write_raw(6.0, "prefill-0@n1", "vllm:b 2\n")
    w.close()
    raw = next(nd.glob("raw-*.zraw"))
    assert raw.stat().st_size < 200  # compressed
    with open(raw, "ab") as f:
        f.write(b"R\t7.000\tdecode-0@n1\t999\n\x78\x9c")  # torn record
    got = list(read_raw(tmp_path))
    assert [(n, t, p) for n, t, p, _ in got] == [("n1", 5.0, "decode-0@n1"),
                                                 ("n1", 6.0, "prefill-0@n1")]
    assert got[0][3] == "vllm:a 1\n" * 100
    assert [g[2] for g in read_raw(tmp_path, processes=["prefill-0@n1"])] == ["prefill-0@n1"]


def test_killed_writer_loses_at_most_the_unflushed_interval(tmp_path: Path) -> None:
    """SIGKILL a real writer process; everything it flushed is readable, and the next writer
    on that node compacts the orphaned text segment."""
    nd = tmp_path / "telemetry" / "n1"
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from launcher.telemetry.store import SampleWriter
        w = SampleWriter(Path({str(nd)!r}))
        i = 0
        while True:
            w.write([(1000.0 + i, "n1", "p", "", "x", {{}}, float(i))])
            w.flush()
            print(i, flush=True)
            i += 1
            time.sleep(0.01)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    last = -1
    assert p.stdout is not None
    deadline = time.time() + 30
    while last < 50 and time.time() < deadline:
        last = int(p.stdout.readline())
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    df = read_samples(tmp_path)
    assert len(df) >= last + 1  # every row flushed before the kill
    assert df.value.tolist() == [float(i) for i in range(len(df))]
    w = SampleWriter(nd)
    w.close()
    assert not list(nd.glob("samples-*.tsv"))
    assert len(read_samples(tmp_path)) == len(df)


def test_compaction_of_an_empty_or_torn_segment(tmp_path: Path) -> None:
    seg = tmp_path / "samples-0000000000001-1.tsv"
    seg.write_bytes(b"1.0\tn\tp\t\tx\t{}\t1.")
    assert compact_segment(seg) is None
    assert not seg.exists()


def test_a_segment_compacted_while_the_reader_lists_the_files_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's thread compacts a segment (parquet written, then the text removed) at
    any moment of a read: here right after the reader's first listing, whichever kind it
    lists first. Its rows are read all the same (fresh41 read none of them once)."""
    node = tmp_path / "telemetry" / "n1"
    w = SampleWriter(node, compact=False)
    w.write(_rows("n1", 1000.0, 50))
    w.close()
    (seg,) = node.glob("samples-*.tsv")
    glob = Path.glob

    def listing_then_compaction(self, pattern, *args, **kwargs):
        found = list(glob(self, pattern, *args, **kwargs))
        if pattern.startswith("samples-") and seg.exists():
            compact_segment(seg)
        return iter(found)

    monkeypatch.setattr(Path, "glob", listing_then_compaction)
    df = read_samples(tmp_path)
    monkeypatch.undo()
    assert not seg.exists() and seg.with_suffix(".parquet").exists()
    assert len(df) == 150, df


@pytest.mark.alone
@pytest.mark.parametrize("n", [20000])
def test_reader_is_fast_with_name_filter(tmp_path: Path, n: int) -> None:
    nd = tmp_path / "telemetry" / "n1"
    w = SampleWriter(nd, rotate_bytes=400_000)
    names = [f"vllm:m{i:03d}" for i in range(100)]
    for k in range(n // 1000):
        w.write([(1000.0 + k, "n1", "p", str(i % 8), names[i % 100], {"le": str(i)}, float(i))
                 for i in range(1000)])
        w.flush()
    w.close()
    t = time.perf_counter()
    df = read_samples(tmp_path, names=["vllm:m007"])
    dt = time.perf_counter() - t
    assert len(df) == n // 100
    assert dt < 2.0
