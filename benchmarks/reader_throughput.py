"""Reader throughput: lines/s of raw Criteo TSV and PaddleRec slot format, thread_num 1
and 2, on the synthetic generator's output (1M lines by default).

Each figure is a QueueDataset pass of one worker over the whole file, batches of 512
(parse + hash + cut into Batch tensors: what the training loop consumes), and an
InMemoryDataset load (parse + hash + concatenate). Also printed: lines per CPU second of
the process (all its threads), a figure less disturbed by other load on a shared
machine. The slot-format file is made once
from the raw file (PaddleRec's min-max dense normalisation, ids = key % 1000001) and
cached beside it.

    python benchmarks/reader_throughput.py [--rows 1000000] [--repeats 3]
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from common import DEFAULT_CACHE_DIR, base_parser, emit, ensure_criteo, log, summarise

from psfleet.data import InMemoryDataset, QueueDataset, parse_criteo_bytes

_MIN = [0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
_DIFF = [20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50]


def ensure_slot_file(raw: Path) -> Path:
    """The slot-format twin of ``raw`` (cached)."""
    out = raw.with_name(raw.stem + "_slot.txt")
    if out.exists():
        return out
    log(f"writing slot-format copy {out}")
    tmp = out.with_suffix(".tmp")
    with raw.open("rb") as src, tmp.open("w") as dst:
        while block := src.read(8 << 20):
            block += src.readline()
            chunk = parse_criteo_bytes(block, str(raw))
            raw_lines = block.decode().split("\n")[:-1]
            if chunk.malformed:  # chunk.sparse rows would not line up with raw_lines
                raise SystemExit(f"{raw}: {chunk.malformed} malformed lines; regenerate it")
            for row, line in enumerate(raw_lines):
                fields = line.split("\t")
                dense = " ".join(
                    f"dense_feature:{(int(v) - _MIN[i]) / _DIFF[i] if v else 0.0:.6g}"
                    for i, v in enumerate(fields[1:14]))
                ids = " ".join(f"{s + 1}:{int(k) % 1000001}"
                               for s, k in enumerate(chunk.sparse[row]))
                dst.write(f"click:{fields[0]} {dense} {ids}\n")
    tmp.rename(out)
    return out


def measure(kind: str, parser: str, path: Path, threads: int, lines: int
            ) -> tuple[float, float]:
    """(lines per wall second, lines per CPU second of this process) of one pass."""
    start, cpu = time.perf_counter(), time.process_time()
    if kind == "QueueDataset":
        stream = QueueDataset(512, parser, thread_num=threads)
        stream.set_filelist([path])
        examples = sum(len(b) for b in stream)
    else:
        memory = InMemoryDataset(512, parser, thread_num=threads)
        memory.set_filelist([path])
        memory.load_into_memory()
        examples = memory.get_memory_data_size()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    if examples != lines:
        raise SystemExit(f"{kind} {parser}: {examples} examples, expected {lines}")
    return lines / wall, lines / cpu


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cache_dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--formats", default="criteo,slot")
    args = parser.parse_args()
    raw, _, _ = ensure_criteo(args.rows, 5000, args.cache_dir)
    files = {"criteo": raw}
    if "slot" in args.formats:
        files["slot"] = ensure_slot_file(raw)
    for fmt in args.formats.split(","):
        for kind in ("QueueDataset", "InMemoryDataset"):
            for threads in (1, 2):
                samples, per_cpu = [], []
                for _ in range(args.repeats):
                    wall_rate, cpu_rate = measure(kind, fmt, files[fmt], threads, args.rows)
                    samples.append(wall_rate)
                    per_cpu.append(cpu_rate)
                    log(f"{fmt} {kind} thread_num {threads}: {wall_rate:,.0f} lines/s "
                        f"({cpu_rate:,.0f} per CPU second)")
                emit({"bench": "reader_throughput", "format": fmt, "reader": kind,
                      "thread_num": threads, "rows": args.rows,
                      "lines_per_s": summarise(samples),
                      "lines_per_cpu_s": summarise(per_cpu),
                      "loadavg": list(os.getloadavg())})


if __name__ == "__main__":
    main()
