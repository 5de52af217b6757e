"""Split the shared Criteo sample's train.csv into day folders for config_online.yaml.

    python examples/criteo_dnn/make_days.py    # writes output_days/day-1..3/ beside it

Rows 1-2400 become ``output_days/day-1/part-0.csv`` (ignored by git, as every
``output*`` folder of the examples), rows 2401-4800 ``day-2``, rows 4801-7200
``day-3`` (real rows, in file order: a stand-in for three days of logs).
Existing day folders are overwritten.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["make_days"]

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[2] / "shared" / "data" / "criteo_kaggle_sample" / "train.csv"


def make_days(source: Path = SOURCE, out: Path = HERE / "output_days",
              days: int = 3) -> list[Path]:
    """Write ``days`` equal folders of ``source``'s lines (the remainder goes to the
    last day); returns the folders, in order.

    Raises:
        FileNotFoundError: ``source`` does not exist (the shared data is missing).
    """
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    size = len(lines) // days
    folders = []
    for k in range(days):
        folder = out / f"day-{k + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        end = len(lines) if k == days - 1 else (k + 1) * size
        (folder / "part-0.csv").write_text("".join(lines[k * size:end]), encoding="utf-8")
        folders.append(folder)
    return folders


if __name__ == "__main__":
    for made in make_days(Path(sys.argv[1]) if len(sys.argv) > 1 else SOURCE):
        print(made)
