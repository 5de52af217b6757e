"""A user's reader script for ``pipe_command``: PaddleRec slot-format lines in on
stdin, slot-format lines out on stdout (standard library only).

psfleet runs it once per data file (``python3 slot_reader.py < FILE``) and parses what
it prints. This one keeps the label, the 13 dense values and the 26 categorical slots
in PaddleRec's order and drops any other token, the way a user script would clean
its input before training.
"""

import sys

SLOTS = ["click", "dense_feature"] + [str(i) for i in range(1, 27)]


def main() -> None:
    out = sys.stdout
    for line in sys.stdin:
        tokens = {}
        for token in line.split():
            slot, _, value = token.partition(":")
            tokens.setdefault(slot, []).append(value)
        if "click" not in tokens:
            continue  # not an example
        out.write(" ".join(f"{slot}:{value}" for slot in SLOTS
                           for value in tokens.get(slot, [])) + "\n")


if __name__ == "__main__":
    main()
