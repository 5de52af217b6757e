"""``psfleet init`` and ``psfleet example``: a starter config without a clone.

Usage::

    psfleet init [--model dnn|wide_deep|deepfm|dcn_v2] [--data criteo|multihot] [--force] DIR
    psfleet example NAME [--out DIR] [--force]
    psfleet example --list

Both write one of the templates shipped in the wheel (``psfleet/templates/
MODEL_DATA.yaml``, package data): a commented config of ``runner.model`` MODEL on the
data ``psfleet datagen DATA`` writes, read from ``data/`` beside the config. A
template's header carries the one ``psfleet datagen`` command that makes its data
(``#   psfleet datagen ...``, paths relative to the config); the commands printed here
are that line with the paths made relative to the current folder.

``init`` writes ``DIR/config.yaml`` (and the empty ``DIR/data/``) and prints the
commands to run next; an existing ``DIR/config.yaml`` is an error unless ``--force``.
``example`` writes the named example (:data:`EXAMPLES`) to ``DIR/config.yaml``
(default ``./NAME``) and prints only that path on stdout, so
``psfleet train -m $(psfleet example criteo_dnn)`` works; what to run to make its data
goes to stderr. Writing an example again over an unchanged copy is not an error.

Errors (:class:`~psfleet.errors.ConfigError`, exit 2) name the argument: an unknown
``--model`` / ``--data`` / NAME (listing the known ones), a DIR that is a file, a
config that exists.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from psfleet.cli.commands import help_of
from psfleet.errors import ConfigError

__all__ = ["MODELS", "DATA_KINDS", "EXAMPLES", "CONFIG_NAME", "Template", "load_template",
           "datagen_argv", "write_config", "register"]

MODELS = ("dnn", "wide_deep", "deepfm", "dcn_v2")
"""``--model`` values: the registered CTR models (docs/models.md)."""

DATA_KINDS = ("criteo", "multihot")
"""``--data`` values: the ``psfleet datagen`` generators."""

EXAMPLES: dict[str, tuple[str, str]] = {
    "criteo_dnn": ("dnn", "criteo"),
    "wide_deep": ("wide_deep", "criteo"),
    "deepfm": ("deepfm", "criteo"),
    "dcn_v2": ("dcn_v2", "criteo"),
    "multivalued_csv": ("dnn", "multihot"),
}
"""``psfleet example`` names -> (model, data) of their template. The repository's
``examples/`` folders of the same names train on ``../shared`` data instead."""

CONFIG_NAME = "config.yaml"
_DATAGEN_PREFIX = "#   psfleet datagen "
_PATH_FLAGS = ("--out", "--test_out")


@dataclass(frozen=True)
class Template:
    """One shipped starter config.

    Attributes:
        model: its ``runner.model``.
        data: the ``psfleet datagen`` generator of its data.
        text: the YAML, written as is.
        summary: its first header line, e.g. ``dnn on synthetic Criteo-like TSV, ...``.
        datagen: the arguments after ``psfleet datagen`` that make its data, paths
            relative to the config's folder.
    """

    model: str
    data: str
    text: str
    summary: str
    datagen: tuple[str, ...]


def _check_choice(flag: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{flag}: {value!r} is not one of {', '.join(allowed)}")


def load_template(model: str, data: str) -> Template:
    """The shipped template of ``model`` on ``data``.

    Raises:
        ConfigError: ``model`` or ``data`` is unknown (names ``--model`` / ``--data``
            and lists the known values), or the package lacks the template (a broken
            install: names the file).
    """
    _check_choice("--model", model, MODELS)
    _check_choice("--data", data, DATA_KINDS)
    name = f"{model}_{data}.yaml"
    resource = resources.files("psfleet").joinpath("templates").joinpath(name)
    try:
        text = resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"template {name!r} is missing from the installed psfleet "
                          f"package ({resource}); reinstall psfleet") from None
    lines = text.splitlines()
    commands = [line[len(_DATAGEN_PREFIX):] for line in lines
                if line.startswith(_DATAGEN_PREFIX)]
    if len(commands) != 1 or not lines[0].startswith("# psfleet starter: "):
        raise ConfigError(f"template {name!r}: needs a '# psfleet starter: ' first line and "
                          f"exactly one {_DATAGEN_PREFIX.strip()!r} line")
    return Template(model=model, data=data, text=text,
                    summary=lines[0].removeprefix("# psfleet starter: ").rstrip("."),
                    datagen=tuple(shlex.split(commands[0])))


def datagen_argv(template: Template, folder: Path) -> list[str]:
    """``psfleet datagen ...`` that writes ``template``'s data for a config in ``folder``:
    its ``--out`` / ``--test_out`` paths prefixed with ``folder``."""
    argv = list(template.datagen)
    for i, arg in enumerate(argv[:-1]):
        if arg in _PATH_FLAGS:
            argv[i + 1] = str(folder / argv[i + 1])
    return ["psfleet", "datagen", *argv]


def _data_paths(template: Template, folder: Path) -> list[Path]:
    argv = datagen_argv(template, folder)
    return [Path(argv[i + 1]) for i, arg in enumerate(argv[:-1]) if arg in _PATH_FLAGS]


def write_config(template: Template, folder: Path, force: bool, flag: str = "DIR",
                 same_ok: bool = False) -> tuple[Path, bool]:
    """Write ``template`` to ``folder/config.yaml``, creating ``folder`` and its
    ``data/`` subfolder (where the data paths point).

    Args:
        template: what to write.
        folder: the config's folder.
        force: overwrite an existing config.
        flag: the argument ``folder`` came from, for messages.
        same_ok: an existing config equal to the template is left as it is.

    Returns:
        The config's path and whether it was written (False: an equal one was there).

    Raises:
        ConfigError: ``folder`` (or ``data/`` in it) is a file, a folder cannot be
            created, or the config exists (and differs, with ``same_ok``) without
            ``force``; names ``flag`` and the path.
    """
    config = folder / CONFIG_NAME
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{flag}: {str(folder)!r} is a file, not a folder; "
                          "choose another folder")
    if config.exists() and not force:
        if same_ok and config.is_file() and config.read_text(encoding="utf-8") == template.text:
            return config, False
        raise ConfigError(f"{flag}: {str(config)!r} already exists; pass --force to "
                          "overwrite it, or choose another folder")
    try:
        (folder / "data").mkdir(parents=True, exist_ok=True)
        config.write_text(template.text, encoding="utf-8")
    except (FileExistsError, NotADirectoryError) as exc:
        raise ConfigError(f"{flag}: cannot create {exc.filename!r}: a file is in the "
                          "way; choose another folder") from None
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot write {str(config)!r}: {exc.strerror}") from None
    return config, True


def _next_steps(template: Template, config: Path) -> list[str]:
    """The commands to run next: datagen (unless the data is there), then train."""
    folder = config.parent
    steps = []
    if not all(path.exists() for path in _data_paths(template, folder)):
        steps.append(shlex.join(datagen_argv(template, folder)))
    steps.append(shlex.join(["psfleet", "train", "-m", str(config)]))
    return steps


def _init(args: argparse.Namespace) -> int:
    template = load_template(args.model, args.data)
    config, _ = write_config(template, args.dir, args.force)
    steps = _next_steps(template, config)
    print(f"psfleet: wrote {config}: {template.summary}. Next, "
          f"{'make its data and train' if len(steps) > 1 else 'train'}:")
    for step in steps:
        print(f"  {step}")
    print("  (in one process, no servers: add -o cluster.server_num=0 -o "
          "cluster.worker_num=1)", flush=True)
    return 0


def _example(args: argparse.Namespace) -> int:
    if args.list:
        if args.name is not None:
            raise ConfigError(f"NAME: {args.name!r} given with --list; give one or the other")
        width = max(len(name) for name in EXAMPLES)
        for name, (model, data) in EXAMPLES.items():
            print(f"{name:<{width}}  {load_template(model, data).summary}")
        return 0
    if args.name is None:
        raise ConfigError(f"NAME: required, one of {', '.join(EXAMPLES)} "
                          "(psfleet example --list)")
    _check_choice("NAME", args.name, list(EXAMPLES))
    template = load_template(*EXAMPLES[args.name])
    folder = args.out if args.out is not None else Path(args.name)
    config, written = write_config(template, folder, args.force, flag="--out", same_ok=True)
    steps = _next_steps(template, config)
    note = "wrote" if written else "kept the unchanged"
    print(f"psfleet: {note} {config}: {template.summary}.", file=sys.stderr)
    if len(steps) > 1:
        print(f"psfleet: make its data first:\n  {steps[0]}", file=sys.stderr)
    print(f"psfleet: then train:\n  {steps[-1]}", file=sys.stderr, flush=True)
    print(config, flush=True)
    return 0


def register(commands: Any) -> None:
    """Add ``init`` and ``example`` to ``commands`` (the subparsers action of
    ``psfleet``'s parser); each sets ``handler``, a function of the parsed arguments
    returning the exit code (raising ConfigError on a bad argument)."""
    init = commands.add_parser(
        "init", help=help_of("init"),
        description=__doc__.split("\n\n")[0])
    init.add_argument("--model", default="dnn", metavar="|".join(MODELS),
                      help="runner.model of the config (default dnn; docs/models.md)")
    init.add_argument("--data", default="criteo", metavar="|".join(DATA_KINDS),
                      help="the psfleet datagen data it reads (default criteo: Criteo-like "
                           "TSV; multihot: CSV with multi-valued columns)")
    init.add_argument("--force", action="store_true", help="overwrite DIR/config.yaml")
    init.add_argument("dir", type=Path, metavar="DIR",
                      help="folder of the config (created; data goes to DIR/data)")
    init.set_defaults(handler=_init)
    example = commands.add_parser(
        "example", help=help_of("example"),
        description="Write the example NAME's config.yaml and print its path (only) on "
                    "stdout: psfleet train -m $(psfleet example criteo_dnn). The command "
                    "that makes its data goes to stderr.")
    example.add_argument("name", nargs="?", metavar="NAME",
                         help=f"one of {', '.join(EXAMPLES)}")
    example.add_argument("--out", type=Path, metavar="DIR",
                         help="folder of the config (default ./NAME; data goes to DIR/data)")
    example.add_argument("--force", action="store_true",
                         help="overwrite a config.yaml that differs from the example")
    example.add_argument("--list", action="store_true", help="list the examples, one a line")
    example.set_defaults(handler=_example)
