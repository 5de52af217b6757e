"""Checkpoint failures do not end a job that trains, and are never silent (issue 15,
finding 7).

- A full checkpoint disk: ``checkpoint_dir`` on a real 1 MiB tmpfs (``mount -t tmpfs``,
  needs root; the test skips saying so when mounting is not permitted) filled to the
  last byte (or but 32 KiB, where the cursors fit and the tables do not). Every
  write fails, the workers' cursor files included; the 1-server,
  2-worker job still trains, exits 0, and its last lines warn that no checkpoint was
  written. Before the fix the cursor write raised ``No space left on device`` and the
  job failed.
- Every checkpoint damaged: a finished job's checkpoints all get a flipped byte; the
  same command again trains from scratch, exits 0, and says clearly (at resume and in
  its last lines) that no usable checkpoint was found.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import run_command, run_folder

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _config(tmp_path: Path, train: Path, checkpoint_dir: Path, servers: int,
            workers: int, epochs: int = 2) -> Path:
    path = tmp_path / f"ckfail-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(json.dumps({
        "runner": {"train_data_dir": str(train), "epochs": epochs, "batch_size": 16,
                   "sync_mode": "async", "model_save_path": str(tmp_path / "out"),
                   "seed": 5, "export_model": False,  # checkpoints only
                   "checkpoint": {"checkpoint_dir": str(checkpoint_dir), "epoch_interval": 1,
                                  "step_interval": 10, "max_num_checkpoints": 2}},
        "hyper_parameters": {"fc_sizes": [8]},
        "cluster": {"server_num": servers, "worker_num": workers},
    }))
    return path


def _train(config: Path) -> subprocess.CompletedProcess[str]:
    return run_command([sys.executable, "-m", "psfleet.cli.main", "train", "-m", str(config)],
                       timeout=240)


@contextlib.contextmanager
def _full_tmpfs(where: Path, free_bytes: int = 0) -> Iterator[Path]:
    """A 1 MiB tmpfs at ``where``, filled until ENOSPC, then ``free_bytes`` given back;
    unmounted on exit."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): "
                    f"{mounted.stderr.strip()}")
    try:
        with (where / "filler").open("wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        if free_bytes:
            filler = where / "filler"
            with filler.open("r+b") as f:
                f.truncate(filler.stat().st_size - free_bytes)
        else:
            with pytest.raises(OSError):
                (where / "probe").write_bytes(b"x" * 4096)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("free_bytes", [0, 32768], ids=["no-byte-free", "cursors-fit"])
def test_full_checkpoint_disk_does_not_end_the_job(tmp_path: Path, free_bytes: int,
                                                   data_slice: Callable[..., Path]) -> None:
    """With 0 bytes free every write fails, the cursors first; with 32 KiB free the
    cursors fit and the servers' table files do not."""
    with _full_tmpfs(tmp_path / "disk", free_bytes) as disk:
        config = _config(tmp_path, data_slice(600), disk / "ck", servers=1, workers=2)
        r = _train(config)
    output = r.stdout + r.stderr
    assert r.returncode == 0, output[-4000:]
    assert "No space left on device" in output  # each failure is logged with its cause
    assert (run_folder(tmp_path / "out") / "metrics.json").is_file()
    tail = _tails(r)
    failed = re.search(r"no checkpoint was written: all (\d+) failed", tail)
    assert failed is not None and int(failed.group(1)) >= 3, tail


def test_resume_with_every_checkpoint_damaged_warns(tmp_path: Path,
                                                    data_slice: Callable[..., Path]) -> None:
    checkpoint_dir = tmp_path / "ck"
    config = _config(tmp_path, data_slice(400), checkpoint_dir, servers=0, workers=1)
    first = _train(config)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    damaged = sorted(checkpoint_dir.glob("ckpt-*"))
    assert damaged
    for folder in damaged:  # flip one byte of every table file
        for table in folder.rglob("table-*"):
            data = bytearray(table.read_bytes())
            data[len(data) // 2] ^= 0xFF
            table.write_bytes(bytes(data))
    r = _train(config)
    output = r.stdout + r.stderr
    assert r.returncode == 0, output[-4000:]
    assert "checksum mismatch" in output
    assert (f"no usable checkpoint in {checkpoint_dir}: all {len(damaged)} are damaged"
            in output), output[-4000:]
    tail = _tails(r)
    assert "resumed from no checkpoint" in tail, tail


def _tails(r: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    """The last lines of stdout (worker 0's output in a launched job) and of stderr."""
    return "\n".join([*r.stdout.strip().splitlines()[-lines:],
                      *r.stderr.strip().splitlines()[-lines:]])
