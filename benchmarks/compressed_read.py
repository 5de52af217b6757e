"""Compressed data files: parse rate (examples/s) of the Criteo sample's train.csv plain
vs gzip vs zstd (and, on request, bzip2 / xz), and what a 2-worker line split costs.

The 7,200-line sample (../shared/data/criteo_kaggle_sample/train.csv, 1.7 MB) is
compressed with each codec's default level (gzip 6, zstd 3, bzip2 9, xz 6) in a
temporary folder (not repeated into a larger file: zstd and xz would then compress the
copies to almost nothing, an unreal ratio). Each figure is the rate over ``--passes``
passes (default 10, 72,000 examples), median of ``--repeats``:

- ``decompress``: reading the whole decompressed text (psfleet.data.compression), MB/s
  of text;
- ``pass``: one QueueDataset pass over the file (criteo parser, thread_num 2, batches
  of 512: read + decompress + parse + batch), examples/s and examples per CPU second;
- ``split2``: worker 0 of 2 with ``split_file_list: True``: it decompresses the whole
  stream and keeps half the lines, so its examples/s (of its half) shows the cost of
  decompressing the other worker's lines too.

    python benchmarks/compressed_read.py [--passes 10] [--repeats 3] [--codecs gz,zst]
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import zstandard
from common import REPO_ROOT, base_parser, emit, log, summarise

from psfleet.data import QueueDataset
from psfleet.data.compression import open_data_file

SAMPLE = (REPO_ROOT / ".." / "shared" / "data" / "criteo_kaggle_sample" / "train.csv").resolve()
SAMPLE_LINES = 7200

COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.compress,
    "zst": lambda data: zstandard.ZstdCompressor().compress(data),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


def decompress_rate(path: Path, passes: int) -> float:
    """MB (10^6 bytes) of decompressed text per second of ``passes`` full reads."""
    start, size = time.perf_counter(), 0
    for _ in range(passes):
        with open_data_file(path) as stream:
            while block := stream.read(4 << 20):
                size += len(block)
    return size / 1e6 / (time.perf_counter() - start)


def pass_rate(path: Path, worker_index: int, worker_num: int, passes: int
              ) -> tuple[float, float]:
    """(examples per wall second, per CPU second) of ``passes`` QueueDataset passes of
    one worker."""
    stream = QueueDataset(512, "criteo", worker_index=worker_index, worker_num=worker_num,
                          split_file_list=True, thread_num=2)
    stream.set_filelist([path])
    expected = (SAMPLE_LINES - worker_index + worker_num - 1) // worker_num
    start, cpu, examples = time.perf_counter(), time.process_time(), 0
    for _ in range(passes):
        examples += sum(len(b) for b in stream)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    if examples != expected * passes:
        raise SystemExit(f"{path}: {examples} examples, expected {expected * passes}")
    return examples / wall, examples / cpu


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=10,
                        help="passes over the 7,200-line sample per figure (default 10)")
    parser.add_argument("--codecs", default="gz,zst",
                        help="compressed variants, among gz, zst, bz2, xz (default gz,zst)")
    args = parser.parse_args()
    if not SAMPLE.is_file():
        raise SystemExit(f"{SAMPLE} is missing: ../shared/data must sit beside the repo")
    with tempfile.TemporaryDirectory(prefix="psfleet-compressed-") as folder:
        plain = Path(folder) / "train.csv"
        plain.write_bytes(SAMPLE.read_bytes())
        files = {"plain": plain}
        for codec in args.codecs.split(","):
            start = time.perf_counter()
            files[codec] = plain.with_name(f"train.csv.{codec}")
            files[codec].write_bytes(COMPRESSORS[codec](plain.read_bytes()))
            log(f"{codec}: compressed {plain.stat().st_size / 1e6:.1f} MB to "
                f"{files[codec].stat().st_size / 1e6:.1f} MB in "
                f"{time.perf_counter() - start:.1f} s")
        for name, path in files.items():
            decompress, whole, whole_cpu, split = [], [], [], []
            for _ in range(args.repeats):
                decompress.append(decompress_rate(path, args.passes))
                rate, cpu_rate = pass_rate(path, 0, 1, args.passes)
                whole.append(rate)
                whole_cpu.append(cpu_rate)
                split.append(pass_rate(path, 0, 2, args.passes)[0])
            record = {"bench": "compressed_read", "file": name, "lines": SAMPLE_LINES,
                      "passes": args.passes,
                      "bytes": path.stat().st_size,
                      "decompress_mb_per_s": summarise(decompress),
                      "pass_examples_per_s": summarise(whole),
                      "pass_examples_per_cpu_s": summarise(whole_cpu),
                      "split2_worker0_examples_per_s": summarise(split),
                      "loadavg": list(os.getloadavg())}
            emit(record)
            log(f"{name:>5}: {path.stat().st_size / 1e6:5.2f} MB, read "
                f"{record['decompress_mb_per_s']['median']:,.0f} "
                f"MB/s of text; pass {record['pass_examples_per_s']['median']:,.0f} "
                f"examples/s ({record['pass_examples_per_cpu_s']['median']:,.0f} per CPU s);"
                f" worker 0 of 2 {record['split2_worker0_examples_per_s']['median']:,.0f} "
                "examples/s of its half")


if __name__ == "__main__":
    main()
