"""Starting ranks: ``python -m oneflow.distributed.launch --nproc_per_node N ...`` on this machine.

``bert-of pretrain / finetune / predict / eval --nproc N`` run their own command line again under
the launcher (:func:`relaunch`); ``bert-of align`` starts its 2-rank workers with :func:`spawn`.
Nothing here imports OneFlow.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

# The package's parent: children import the same bert_of as this process.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_rank_of(nproc: int) -> bool:
    """True in a process the launcher started as one of ``nproc`` ranks. (OneFlow itself puts
    WORLD_SIZE=1 into os.environ of any process that imported it: that is not a launch.)"""
    return int(os.environ.get("WORLD_SIZE", "1")) == nproc


def free_port() -> int:
    """A free TCP port on loopback, for the ranks' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(target: list, nproc: int) -> list:
    """The command line running ``python TARGET...`` (e.g. ``["-m", "bert_of.cli", ...]``) as ``nproc``
    ranks; one plain process for nproc 1."""
    if nproc <= 1:
        return [sys.executable, *target]
    return [sys.executable, "-m", "oneflow.distributed.launch", "--nproc_per_node", str(nproc), "--master_port",
            str(free_port()), *target]


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def spawn(target: list, nproc: int, **popen) -> subprocess.Popen:
    """Start ``target`` as ``nproc`` ranks in the background."""
    return subprocess.Popen(command(target, nproc), env=child_env(), **popen)


def relaunch(argv: list, nproc: int) -> int:
    """Run the ``bert-of`` command line ``argv`` again as ``nproc`` ranks; their exit status."""
    return subprocess.call(command(["-m", "bert_of.cli", *argv], nproc), env=child_env())
