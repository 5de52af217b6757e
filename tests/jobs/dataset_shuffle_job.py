"""One worker of a global-shuffle job without servers (tests/test_dataset_readers.py).

usage: dataset_shuffle_job.py WORKER_INDEX WORKER_NUM EXCHANGE_DIR OUT.npz FILE...

Loads its share into an InMemoryDataset (split_file_list False), runs global_shuffle
through a FileExchange whose barrier is a FileBarrier in EXCHANGE_DIR/barriers, and
saves the examples it holds afterwards (in its order) to OUT.npz.
"""

import sys
from pathlib import Path

import numpy as np

from psfleet.data import FileBarrier, FileExchange, InMemoryDataset


def main() -> None:
    index, num = int(sys.argv[1]), int(sys.argv[2])
    exchange_dir, out, files = Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:]
    dataset = InMemoryDataset(1000, "criteo", worker_index=index, worker_num=num,
                              split_file_list=False, thread_num=2)
    dataset.set_filelist(files)
    dataset.load_into_memory()
    before = dataset.get_memory_data_size()
    barrier = FileBarrier(exchange_dir / "barriers", index, num, timeout_s=120)
    exchange = FileExchange(exchange_dir, index, num, barrier)
    dataset.global_shuffle(exchange, seed=11)
    total = dataset.get_memory_data_size(exchange)
    batches = list(dataset)
    np.savez(out, before=before, total=total,
             labels=np.concatenate([b.labels.numpy() for b in batches]),
             dense=np.concatenate([b.dense.numpy() for b in batches]),
             sparse=np.concatenate([b.sparse.numpy() for b in batches]))


if __name__ == "__main__":
    main()
