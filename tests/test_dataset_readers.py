"""QueueDataset, InMemoryDataset and the DataLoader reader on the real Criteo sample:
every example exactly once across workers, determinism, resume, global shuffle
between real processes, bad input."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, clean_env, require_shared_data

from psfleet.data import (
    CriteoReader,
    DataLoaderReader,
    FileBarrier,
    FileExchange,
    InMemoryDataset,
    QueueDataset,
    Reader,
    parse_lines,
)
from psfleet.errors import ConfigError, DataError

pytestmark = pytest.mark.job

FILES = [require_shared_data() / f"{name}.csv" for name in ("train", "dev", "test")]
TOTAL = 8000


def rows(reader: Reader) -> list[bytes]:
    """Every example the reader yields, as bytes (label, dense, keys)."""
    out = []
    for batch in reader:
        labels, dense, sparse = batch.labels.numpy(), batch.dense.numpy(), batch.sparse.numpy()
        out.extend(labels[i].tobytes() + dense[i].tobytes() + sparse[i].tobytes()
                   for i in range(len(labels)))
    return out


def reference() -> list[bytes]:
    """The examples of all files, parsed by the reference line parser."""
    out = []
    for path in FILES:
        chunk = parse_lines(path.read_text().split("\n")[:-1], str(path))
        out.extend(chunk.labels[i].tobytes() + chunk.dense[i].tobytes()
                   + chunk.sparse[i].view(np.int64).tobytes() for i in range(len(chunk)))
    return sorted(out)


def make(kind: str, index: int, num: int, split: bool, **extra: object) -> Reader:
    common: dict[str, object] = {"worker_index": index, "worker_num": num,
                                 "split_file_list": split, "thread_num": 2, **extra}
    if kind == "QueueDataset":
        queue = QueueDataset(300, "criteo", **common)  # type: ignore[arg-type]
        queue.set_filelist(FILES)
        return queue
    memory = InMemoryDataset(300, "criteo", shuffle_seed=5, **common)  # type: ignore[arg-type]
    memory.set_filelist(FILES)
    memory.load_into_memory()
    return DataLoaderReader(memory) if kind == "DataLoader" else memory


@pytest.mark.parametrize("kind", ["QueueDataset", "InMemoryDataset", "DataLoader"])
@pytest.mark.parametrize("num", [1, 3])
@pytest.mark.parametrize("split", [False, True])
def test_every_example_exactly_once_across_workers(kind: str, num: int, split: bool) -> None:
    expected = reference()
    shares = [rows(make(kind, k, num, split)) for k in range(num)]

    assert sorted(r for share in shares for r in share) == expected
    assert sum(len(s) for s in shares) == TOTAL
    if num == 3 and not split:  # whole files: worker k reads file k
        assert [len(s) for s in shares] == [7200, 409, 391]


def test_pipe_command_gives_the_same_examples_as_direct_reading() -> None:
    direct = [rows(make("QueueDataset", k, 3, True)) for k in range(3)]
    piped = [rows(make("QueueDataset", k, 3, True, pipe_command="cat")) for k in range(3)]

    assert piped == direct  # same examples, same order, per worker


def test_criteo_reader_and_stream_agree_on_a_single_file() -> None:
    stream = QueueDataset(1000, "criteo", worker_index=1, worker_num=3)
    stream.set_filelist(FILES[:1])
    memory = CriteoReader(FILES[:1], 1000, 1, 3)
    assert rows(stream) == rows(memory)


@pytest.mark.parametrize("kind", ["QueueDataset", "InMemoryDataset", "DataLoader"])
def test_start_batch_resumes_exactly_with_two_threads(kind: str) -> None:
    reader = make(kind, 1, 3, True)
    reader.set_epoch(2)
    full = rows(reader)
    reader.set_epoch(2)
    reader.set_start_batch(4)
    resumed = rows(reader)
    again = rows(reader)  # the skip applies to one iteration only

    assert resumed == full[4 * 300:]
    assert again == full


def test_in_memory_shuffle_depends_on_epoch_only() -> None:
    a, b = make("InMemoryDataset", 0, 1, True), make("InMemoryDataset", 0, 1, True)
    a.set_epoch(1)
    b.set_epoch(1)
    first = rows(a)
    assert first == rows(b)
    b.set_epoch(2)
    second = rows(b)
    assert second != first and sorted(second) == sorted(first)


def test_sync_limit_makes_stream_lengths_equal_or_fails_clearly(tmp_path: Path) -> None:
    stream = make("QueueDataset", 0, 3, True)
    assert isinstance(stream, QueueDataset)
    shares = stream.worker_lines()
    assert sum(shares) == TOTAL and max(shares) - min(shares) <= 1
    stream.set_example_limit(min(shares))
    assert len(rows(stream)) == min(shares) and stream.num_batches == -(-min(shares) // 300)

    bad = tmp_path / "bad.tsv"
    lines = FILES[1].read_text().split("\n")[:10]
    bad.write_text("\n".join(lines[:5] + ["1\tnot\ta\tline"] + lines[5:]) + "\n")
    short = QueueDataset(4, "criteo", max_malformed_fraction=1.0)
    short.set_filelist([bad])
    short.set_example_limit(11)  # 11 lines, one malformed
    with pytest.raises(DataError, match="ended after 10 examples, but 11"):
        rows(short)


def test_malformed_lines_are_skipped_with_file_and_line_or_raise_when_strict(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = FILES[1].read_text().split("\n")[:20]
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(lines[:7] + ["0\t1\t2"] + lines[7:]) + "\n")
    stream = QueueDataset(8, "criteo", thread_num=2, max_malformed_fraction=1.0)
    stream.set_filelist([bad])

    assert len(rows(stream)) == 20
    assert stream.last_pass is not None and stream.last_pass.malformed == 1
    assert any(f"{bad}:8:" in r.getMessage() for r in caplog.records)

    strict = InMemoryDataset(8, "criteo", strict=True)
    strict.set_filelist([bad])
    with pytest.raises(DataError, match=f"{bad}:8: malformed Criteo line"):
        strict.load_into_memory()


def test_failing_pipe_command_stops_with_its_stderr_and_the_file_name() -> None:
    stream = QueueDataset(100, "criteo", pipe_command="head -n 5; echo 'no such column' >&2; "
                          "exit 3")
    stream.set_filelist(FILES[1:2])
    with pytest.raises(DataError) as info:
        rows(stream)
    message = str(info.value)
    assert "exit code 3" in message and "no such column" in message
    assert str(FILES[1]) in message


def test_fewer_files_than_workers_without_line_split_is_an_error() -> None:
    stream = QueueDataset(100, "criteo", worker_index=0, worker_num=4, split_file_list=False)
    with pytest.raises(ConfigError, match="3 files for 4 workers"):
        stream.set_filelist(FILES)


def test_preload_and_release() -> None:
    memory = InMemoryDataset(500, "criteo")
    memory.set_filelist(FILES[1:])
    memory.preload_into_memory()
    memory.wait_preload_done()
    assert memory.get_memory_data_size() == 800 and memory.num_batches == 2
    memory.local_shuffle(seed=3)
    assert memory.get_memory_data_size() == 800
    memory.release_memory()
    with pytest.raises(Exception, match="load_into_memory"):
        list(memory)


def _shuffle_job(tmp_path: Path, run: str, num: int) -> list[dict[str, np.ndarray]]:
    script = REPO_ROOT / "tests" / "jobs" / "dataset_shuffle_job.py"
    exchange = tmp_path / run
    procs = [subprocess.Popen([sys.executable, str(script), str(k), str(num), str(exchange),
                               str(tmp_path / f"{run}-{k}.npz"), *map(str, FILES)],
                              env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(num)]
    try:
        outputs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [dict(np.load(tmp_path / f"{run}-{k}.npz")) for k in range(num)]


def _shuffle_in_threads(directory: Path, num: int) -> list[np.ndarray]:
    """The same job as tests/jobs/dataset_shuffle_job.py, one thread per worker."""
    results: list[np.ndarray] = [np.zeros(0)] * num
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            memory = InMemoryDataset(1000, "criteo", worker_index=k, worker_num=num,
                                     split_file_list=False, thread_num=2)
            memory.set_filelist(FILES)
            memory.load_into_memory()
            exchange = FileExchange(directory, k, num,
                                    FileBarrier(directory / "barriers", k, num, timeout_s=120))
            memory.global_shuffle(exchange, seed=11)
            results[k] = np.concatenate([b.sparse.numpy() for b in memory])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(num)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


@pytest.mark.slow
def test_global_shuffle_between_processes_keeps_the_multiset_and_is_deterministic(
        tmp_path: Path) -> None:
    first = _shuffle_job(tmp_path, "a", 3)

    assert [int(r["before"]) for r in first] == [7200, 409, 391]
    assert [len(r["labels"]) for r in first] == [2667, 2667, 2666]
    assert all(int(r["total"]) == TOTAL for r in first)
    union = sorted(r["labels"][i].tobytes() + r["dense"][i].tobytes() + r["sparse"][i].tobytes()
                   for r in first for i in range(len(r["labels"])))
    assert union == reference()
    # Each worker holds examples of every file, not its own file only.
    dev_keys = {row.tobytes() for row in make_keys(FILES[1])}
    assert all(any(row.tobytes() in dev_keys for row in r["sparse"]) for r in first)
    # Same seed, same result, whatever the timing (here: threads of one process).
    again = _shuffle_in_threads(tmp_path / "b", 3)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a["sparse"], b)


def make_keys(path: Path) -> np.ndarray:
    chunk = parse_lines(path.read_text().split("\n")[:-1], str(path))
    return chunk.sparse.view(np.int64)
