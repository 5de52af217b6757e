"""``psfleet k8s``: run a parameter-server job on Kubernetes.

Usage::

    psfleet k8s render -m CONFIG.yaml --image IMAGE [-o KEY=VALUE ...] [--name NAME]
        [--namespace NS] [--volume CLAIM:PATH ...] [--auth_secret NAME]
        [--workdir DIR] [--port P] [--out FILE]
    psfleet k8s submit (the same arguments) [--kubectl PATH]

``render`` writes the job's manifests (:mod:`psfleet.cluster.k8s`) to ``--out`` or
stdout; notes on what the job will lose where (a checkpoint folder missing, a run
folder on no volume) go to stderr. ``submit`` renders them into ``--out`` (default
``NAME.k8s.yaml`` in the current folder) and runs ``kubectl apply -f`` on that file.

Exit codes: 0 success; 1 kubectl failed (its message is printed); 2 a bad config or
argument (named), or no kubectl on the PATH.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from psfleet.cli.cluster_args import add_job_arguments, job_from_args
from psfleet.cli.commands import help_of
from psfleet.cluster.k8s import (
    IMAGE_WORKDIR,
    K8sOptions,
    check_storage,
    manifests_yaml,
    parse_volume,
    render_manifests,
)
from psfleet.errors import ConfigError

__all__ = ["register"]


def _rendered(args: argparse.Namespace) -> tuple[str, str]:
    """(the job's name, its manifests as YAML); notes go to stderr."""
    job = job_from_args(args, f"psfleet k8s {args.action}")
    options = K8sOptions(args.image, args.namespace,
                         tuple(parse_volume(v) for v in args.volume), args.auth_secret)
    docs = render_manifests(job, options)
    for note in check_storage(job, options):
        print(f"psfleet: note: {note}", file=sys.stderr)
    return job.name, manifests_yaml(docs)


def _render(args: argparse.Namespace) -> int:
    _, text = _rendered(args)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"psfleet: wrote {args.out}", file=sys.stderr)
    return 0


def _submit(args: argparse.Namespace) -> int:
    kubectl = shutil.which(args.kubectl)
    if kubectl is None:
        raise ConfigError(f"--kubectl: {args.kubectl!r} is not on the PATH: install kubectl, "
                          "or write the manifests with psfleet k8s render --out FILE and "
                          "apply them your way")
    name, text = _rendered(args)
    out = args.out or Path(f"{name}.k8s.yaml")
    out.write_text(text)
    print(f"psfleet: wrote {out}; kubectl apply -f {out}", file=sys.stderr, flush=True)
    done = subprocess.run([kubectl, "apply", "-f", str(out)], check=False)
    if done.returncode != 0:
        print(f"psfleet: failed: kubectl apply exited {done.returncode} (its message is "
              f"above); the manifests are in {out}", file=sys.stderr)
        return 1
    return 0


def register(commands: Any) -> None:
    """Add ``k8s`` (``render``, ``submit``) to ``commands`` (the subparsers action of
    ``psfleet``'s parser); each sets ``handler``, a function of the parsed arguments
    returning the exit code (raising ConfigError on a bad argument)."""
    k8s = commands.add_parser("k8s", help=help_of("k8s"),
                              description=__doc__.split("\n\n")[0])
    actions = k8s.add_subparsers(dest="action", required=True)
    for action, text, handler in (
            ("render", "write the job's manifests", _render),
            ("submit", "render the manifests and kubectl apply them", _submit)):
        parser = actions.add_parser(action, help=text, description=__doc__.split("\n\n")[1])
        add_job_arguments(parser, IMAGE_WORKDIR, IMAGE_WORKDIR)
        parser.add_argument("--image", required=True,
                            help="the container image with psfleet (see the Dockerfile)")
        parser.add_argument("--namespace", help="the objects' namespace (default: "
                            "kubectl's current one)")
        parser.add_argument("--volume", action="append", default=[], metavar="CLAIM:PATH",
                            help="mount an existing PersistentVolumeClaim into every pod; "
                            "the checkpoint folder must be on one (or an fsspec URL)")
        parser.add_argument("--auth_secret", metavar="NAME", help="an existing Secret "
                            "whose key 'token' is the job's auth token (default: a new "
                            "random token in the manifests)")
        parser.add_argument("--out", type=Path, help="the file to write (render: default "
                            "stdout; submit: default NAME.k8s.yaml)")
        if action == "submit":
            parser.add_argument("--kubectl", default="kubectl", help="the kubectl to run")
        parser.set_defaults(handler=handler)
