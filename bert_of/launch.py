"""Ranks: starting them, and a job of several ranks that behaves like one command.

``bert-of pretrain / finetune / predict / eval --nproc N`` run their own command line again as N
ranks of this machine (:func:`run_ranks`), optionally as node R of M (``--nnodes M --node-rank R
--master-addr A --master-port P``: every node runs the same command with its own ``--node-rank``);
``bert-of align`` starts its multi-rank workers with :func:`spawn`. Nothing here imports OneFlow.

A rank is an ordinary process with OneFlow's launcher variables MASTER_ADDR, MASTER_PORT,
WORLD_SIZE and RANK. A ``bert-of`` command started that way by any external launcher or scheduler
runs as that rank (give it no ``--nproc``): see :func:`in_rank`.

Ranks are started here, not by ``python -m oneflow.distributed.launch`` (which sets the same
variables), because that launcher

- sets LOCAL_RANK from its own node index while OneFlow counts nodes by distinct host addresses:
  two launchers on one host (2 "nodes" on loopback) give two ranks of what OneFlow sees as one node
  LOCAL_RANK 0; the first collective fails on one (``cpu_all_reduce``: parallel_id not found) and
  the other waits for it until gRPC gives up. Left unset, OneFlow derives LOCAL_RANK from its own
  view (rank % ranks per host), right on one host and on many;
- ends a job whose rank failed with a ``CalledProcessError`` traceback, reaches the other ranks
  (``os.killpg`` of its own pid) only when it leads a process group, and leaves them running when
  it is killed itself.

Here every rank dies with this process (``PR_SET_PDEATHSIG``: even SIGKILL of the parent stops
them), Ctrl-C / SIGTERM stop the ranks and end the job by that signal as they end one rank (130 /
143; the handler is the command's, bert_of.runtime.process), the first rank to fail ends the job, and its
last error line is printed once, naming the rank. Every rank is set up as a command's process
(:func:`bert_of.runtime.process.setup`) before its target runs.
"""

from __future__ import annotations

import os
import re
import runpy
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import bert_of.runtime.process as process
from bert_of.errors import BertOfError, ConfigError

# The package's parent: children import the same bert_of as this process.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
PARENT_ENV = "BERT_OF_PARENT_PID"  # set in ranks started here: they die with that process
CPUS_ENV = "BERT_OF_RANK_CPUS"  # the CPUs a rank started here runs on ("0,1"), set before OneFlow starts
PIN_ENV = "BERT_OF_PIN"  # 0: do not pin ranks to CPUs
ERROR_PREFIX = "bert-of: error: "
GRACE_S = 5.0  # after SIGTERM, ranks get this long to stop before SIGKILL
# Rank output that never says why it failed: start-up notes, glog info/warnings, stack frames.
_CHATTER = re.compile(r"libibverbs not available|[IW]\d{8} |\s+@ |\*\*\* |\s*$")
# A rank's crash report (glog fatal, C++ terminate, its stack): summed up by the job, not shown.
_CRASH = re.compile(r"[FE]\d{8} |\*\*\* |\s+@ |terminate called|  what\(\):")


class RankFailed(BertOfError):
    """A rank of a multi-rank job failed; the message names it and says why."""


# --------------------------------------------------------------------------- topology


@dataclass
class Topology:
    """Where the ranks of a job run: ``nproc`` on each of ``nnodes`` machines, this one ``node_rank``."""

    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port (one node only)

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    def check(self) -> "Topology":
        if self.nproc < 1:
            raise ConfigError(f"--nproc must be at least 1, got {self.nproc}")
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank {self.node_rank} is not in 0..{self.nnodes - 1} (--nnodes {self.nnodes})")
        if self.nnodes > 1 and self.master_port is None:
            raise ConfigError("--nnodes > 1 needs --master-port: the same free port of the master node on every node")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ConfigError(f"--master-port {self.master_port} is not a TCP port")
        return self


def add_arguments(parser, nproc: bool = True) -> None:
    """``--nproc --nnodes --node-rank --master-addr --master-port`` on a command's parser (``nproc``
    False: the command decides its ranks, the nodes are what the user says)."""
    g = parser.add_argument_group("ranks (data parallel; under an external launcher give none of these)")
    if nproc:
        g.add_argument("--nproc", type=int, default=1, metavar="N",
                       help="ranks on this machine (the command runs itself again as N ranks; default 1)")
    g.add_argument("--nnodes", type=int, default=1, metavar="M",
                   help="machines in the job; every node runs the same command with its own --node-rank")
    g.add_argument("--node-rank", type=int, default=0, metavar="R", help="this machine's index, 0..M-1 (0 = master)")
    g.add_argument("--master-addr", default="127.0.0.1", metavar="A",
                   help="node 0's address every node can reach (default 127.0.0.1: one machine)")
    g.add_argument("--master-port", type=int, metavar="P",
                   help="a free TCP port on node 0, the same on every node (default: any free port; one node)")


def topology(args, nproc: int | None = None) -> Topology:
    return Topology(nproc or args.nproc, args.nnodes, args.node_rank, args.master_addr, args.master_port).check()


def in_rank() -> bool:
    """True in a process started as one rank of several (by this module or any launcher that sets
    OneFlow's variables). WORLD_SIZE=1 / RANK=-1 (what OneFlow's start-up puts in the environment of
    a single process; bert_of.runtime.process takes it back out) is not a rank of several."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "-1")) >= 0
    except ValueError:
        return False


def free_port() -> int:
    """A free TCP port on loopback, for the ranks' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- environments


def child_env() -> dict:
    """This environment for a child process running bert_of: no rank variables of ours (a rank's
    own, from its launcher), this bert_of first on the path."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and k != PARENT_ENV}
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def rank_envs(topo: Topology) -> list:
    """The environment of each of this node's ranks (global rank order)."""
    port = topo.master_port if topo.master_port is not None else free_port()
    base = child_env()
    base.update(MASTER_ADDR=topo.master_addr, MASTER_PORT=str(port), WORLD_SIZE=str(topo.world))
    base[PARENT_ENV] = str(os.getpid())
    base.setdefault("OMP_NUM_THREADS", "1")  # as OneFlow's launcher: ranks share the cores
    envs = []
    cpus = rank_cpus(topo.nproc)
    for local in range(topo.nproc):
        env = dict(base, RANK=str(topo.node_rank * topo.nproc + local))
        # No LOCAL_RANK: OneFlow derives it from the ranks it sees per host (see the module doc).
        if cpus:
            env[CPUS_ENV] = ",".join(map(str, cpus[local]))
        envs.append(env)
    return envs


def rank_cpus(nproc: int) -> list | None:
    """This process's CPUs split into ``nproc`` equal groups, one per rank; None when they cannot be
    split (fewer CPUs than ranks) or BERT_OF_PIN=0."""
    if os.environ.get(PIN_ENV, "1") == "0" or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    per = len(cpus) // nproc
    if per < 1:
        return None
    return [cpus[i * per:(i + 1) * per] for i in range(nproc)]


# --------------------------------------------------------------------------- in a rank


def _die_with_parent() -> None:
    """In a process started here: be killed when the process that started it dies."""
    if os.environ.get(PARENT_ENV):
        process.die_with_parent(int(os.environ[PARENT_ENV]))


def rank_main(argv: list) -> None:
    """``python -m bert_of.launch [-m MODULE | SCRIPT] ARGS...``: one rank: set up, then run the target
    as ``python`` would."""
    _die_with_parent()
    if os.environ.get(CPUS_ENV):  # before OneFlow starts: its threads inherit the mask
        os.sched_setaffinity(0, {int(c) for c in os.environ[CPUS_ENV].split(",")})
    process.setup()  # a command's process, before the target's imports load native libraries
    if argv[:1] == ["-m"] and len(argv) >= 2:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    else:
        sys.exit("usage: python -m bert_of.launch [-m MODULE | SCRIPT] ARGS...")


# --------------------------------------------------------------------------- the job


class _Rank:
    """One rank process and two threads: one reads its stderr (rank 0's is passed on: progress,
    warnings), one waits for its exit. Error lines and crash reports (glog aborts) are kept, not
    shown: the job reports the first failure once. ``failed_at`` orders the failures."""

    def __init__(self, rank: int, target: list, env: dict, show: bool, stdout):
        self.rank = rank
        self.proc = subprocess.Popen([sys.executable, "-m", "bert_of.launch", *target], env=env,
                                     stdout=stdout, stderr=subprocess.PIPE, start_new_session=True)
        self.errors, self.tail = [], []
        self.show = show
        self.failed_at = None
        self.returncode = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.reader.start()
        self.waiter.start()

    def _fail(self):
        if self.failed_at is None:
            self.failed_at = time.monotonic()

    def _wait(self):
        rc = self.proc.wait()
        if rc:
            self._fail()
        self.returncode = rc

    def _read(self):
        pending = b""
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        while True:
            chunk = os.read(self.proc.stderr.fileno(), 65536)
            if not chunk:
                break
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            shown = []
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if line.startswith(ERROR_PREFIX):
                    self.errors.append(line[len(ERROR_PREFIX):])
                    self._fail()
                    continue
                if line.strip():
                    self.tail = (self.tail + [line])[-20:]
                if not _CRASH.match(line):
                    shown.append(raw + b"\n")
            if pending and not ERROR_PREFIX.encode().startswith(pending[:len(ERROR_PREFIX)]) \
                    and not _CRASH.match(pending.decode("utf-8", "replace")):
                shown.append(pending)  # a progress bar's \r update: no newline to wait for
                pending = b""
            if self.show and shown and out is not None:
                try:
                    out.write(b"".join(shown))
                    out.flush()
                except (OSError, ValueError):
                    pass
        self.proc.stderr.close()

    def why(self) -> str:
        """Why this rank failed, in one line."""
        if self.errors:
            return self.errors[-1]
        rc = self.proc.returncode
        what = "failed" if rc is None else process.how_it_ended(rc)
        last = next((l.strip() for l in reversed(self.tail) if not _CHATTER.match(l)), "")
        return what + (f"; last output: {last[:300]}" if last else "")


def _stop(ranks, grace: float) -> None:
    """SIGTERM every live rank (each leads its own session), SIGKILL what is left after ``grace`` s."""
    process.stop_groups([r.proc for r in ranks], grace)


def run_ranks(target: list, topo: Topology, grace: float = GRACE_S) -> int:
    """Run ``python TARGET...`` (``["-m", "bert_of.cli", ...]``) as this node's ranks of ``topo``
    and wait: 0 when every rank succeeded. Otherwise the first failure ends the job and raises
    :class:`RankFailed` naming that rank and its last error. Ctrl-C / SIGTERM of this process (the
    command's handler raises KeyboardInterrupt / Terminated: bert_of.runtime.process) stop the ranks and go
    on up, so the job ends as one rank would (130 / 143)."""
    envs = rank_envs(topo)
    ranks = []
    try:
        for env in envs:
            rank = int(env["RANK"])
            ranks.append(_Rank(rank, target, env, show=rank == 0, stdout=None if rank == 0 else subprocess.DEVNULL))
        failed = None
        while True:
            # A rank that said its error has failed, whether or not it has exited: OneFlow's exit
            # waits for the other ranks, which wait in a collective for it.
            down = [r for r in ranks if r.failed_at is not None]
            if down:
                failed = min(down, key=lambda r: r.failed_at)
                break
            if all(r.returncode is not None for r in ranks):
                break
            time.sleep(0.02)
        if failed is not None:
            _stop(ranks, min(grace, 2.0))  # the others wait in a collective for the dead rank
        for r in ranks:
            r.reader.join(timeout=5)
        if failed is not None:
            raise RankFailed(f"rank {failed.rank}: {failed.why()}")
        return 0
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (Terminated) of this process: the job stops as one
        _stop(ranks, grace)
        raise
    finally:
        if any(r.proc.poll() is None for r in ranks):  # an exception of our own: no rank outlives us
            _stop(ranks, 0)


def relaunch(argv: list, topo: Topology) -> int:
    """Run the ``bert-of`` command line ``argv`` again as this node's ranks of ``topo``."""
    return run_ranks(["-m", "bert_of.cli", *argv], topo)


def maybe_relaunch(args) -> int | None:
    """For a command with :func:`add_arguments`: its exit status after running as ranks, or None
    when this process is to do the work (one process, or already a rank)."""
    topo = topology(args)
    if in_rank():
        world = int(os.environ["WORLD_SIZE"])
        if topo.world > 1 and topo.world != world:
            raise ConfigError(f"--nproc {topo.nproc} x --nnodes {topo.nnodes} = {topo.world} ranks, but this "
                              f"process is one of {world} ranks of a launch")
        return None
    if topo.world == 1:
        return None
    return relaunch(args.argv, topo)


# --------------------------------------------------------------------------- background launches (align)


def spawn(target: list, world: int, nodes: Topology | None = None, **popen) -> subprocess.Popen:
    """Start ``target`` as ``world`` ranks in the background, spread over ``nodes`` (this node's share;
    the other nodes run theirs): a process whose exit status is the job's, 1 with one error line
    on stderr when a rank failed (``python -m bert_of.launch --job ...``)."""
    if world <= 1:
        return subprocess.Popen([sys.executable, *target], env=child_env(), **popen)
    nodes = nodes or Topology()
    if world % nodes.nnodes:
        raise ConfigError(f"{world} ranks cannot be spread evenly over --nnodes {nodes.nnodes}")
    job = ["--job", str(world // nodes.nnodes), str(nodes.nnodes), str(nodes.node_rank), nodes.master_addr,
           str(nodes.master_port or 0)]
    env = dict(child_env(), **{PARENT_ENV: str(os.getpid())})
    return subprocess.Popen([sys.executable, "-m", "bert_of.launch", *job, *target], env=env, **popen)


def _job_main(argv: list) -> int:
    """A background job of ranks (:func:`spawn`): its exit status and error line are the job's, and
    Ctrl-C / SIGTERM stop the ranks and end it by that signal, as a command line."""
    _die_with_parent()  # and the ranks with this process
    process.setup()
    nproc, nnodes, node_rank, addr, port = argv[:5]
    topo = Topology(int(nproc), int(nnodes), int(node_rank), addr, int(port) or None)
    try:
        with process.command():
            return run_ranks(argv[5:], topo.check())
    except BertOfError as e:
        print(f"{ERROR_PREFIX}{e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        return process.end_if_stopped(process.stopped(e))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:  # --job NPROC NNODES NODE_RANK MASTER_ADDR MASTER_PORT TARGET...
        sys.exit(_job_main(sys.argv[2:]))
    rank_main(sys.argv[1:])
