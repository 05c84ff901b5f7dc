"""Shared fixtures: small configs in Google's bert_config.json form, and a CLI runner."""

import contextlib
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

from bert_of.runtime.process import drain_oneflow, set_environ
from bert_of.progress import allow_bars, setup_logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Odd sizes on purpose: a transposed or mislabelled dimension cannot hide.
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=37, hidden_act="gelu", hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1, max_position_embeddings=40, type_vocab_size=3,
            initializer_range=0.02)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    """Each test starts with OneFlow idle: a test's own environment writes (monkeypatch.setenv, a
    fixture's os.environ) then meet no kernel reading the environment (bert_of.runtime.process.set_environ)."""
    drain_oneflow()
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """Drained again before the fixtures undo their environment changes."""
    drain_oneflow()
    yield


@pytest.fixture(autouse=True)
def notes_on_stderr():
    """Library notes go to the bert_of logger; tests see them on stderr as a `bert-of` command shows
    them (capsys), at the default level whatever an earlier in-process command set."""
    setup_logging(0)


@pytest.fixture
def tiny_google_config():
    return dict(TINY)


def write_vocab(path, n):
    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    words = specials + [f"tok{i}" for i in range(n - len(specials))]
    with open(path, "w") as f:
        f.write("\n".join(words[:n]) + "\n")
    return str(path)


# Sets PR_SET_PDEATHSIG in the child itself, then execs the real command (it survives exec): no
# preexec_fn, which is unsafe in a process with threads (OneFlow's, in the test process).
_DIES_WITH_PARENT = ("import ctypes, os, sys; ppid = int(sys.argv[1]); ctypes.CDLL(None).prctl(1, 9); "
                     "os.getppid() == ppid or os._exit(1); os.execv(sys.argv[2], sys.argv[2:])")


def dies_with_the_suite(cmd: list) -> list:
    """``cmd`` (a list starting with the program's path) so that the kernel kills it when the test
    process dies (PR_SET_PDEATHSIG): a long-running child (a pretrain of 100,000 steps a test stops
    itself) of a crashed or killed suite is not left behind to load the machine."""
    return [sys.executable, "-c", _DIES_WITH_PARENT, str(os.getpid()), *map(str, cmd)]


RANK_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
# BERT_OF_TEST_SUBPROCESS=1 runs every run_cli() in its own process (slower; what CI did before).
ALWAYS_SUBPROCESS = os.environ.get("BERT_OF_TEST_SUBPROCESS", "") not in ("", "0")


def run_cli(*args, check=True, timeout=600, process=False, env=None):
    """Run the real `bert-of` command line: ``bert_of.cli.main`` in this process (the default), or
    ``python -m bert_of.cli`` in a subprocess (``process=True``) where the process itself is under
    test: its exit status as the shell sees it, a crash, what its start-up imports. Both give a
    CompletedProcess with the exit status and what the command wrote to stdout and stderr. ``env``:
    variables set for this command only."""
    args = [str(a) for a in args]
    # create-pretraining forks its workers: a fork of this test process (its threads, its captured
    # descriptors) is not what a user's shell forks, and has hung here.
    if process or ALWAYS_SUBPROCESS or "create-pretraining" in args[:3]:
        # OneFlow puts WORLD_SIZE/RANK/... into os.environ of processes that import it: a child
        # must not inherit them as if it had been launched as a rank.
        child = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
        child.update(env or {}, PYTHONPATH=ROOT)
        r = subprocess.run([sys.executable, "-m", "bert_of.cli", *args], capture_output=True, text=True,
                           env=child, timeout=timeout, cwd=ROOT)
    else:
        r = _run_in_process(args, env or {})
    if check and r.returncode != 0:
        raise AssertionError(f"bert-of {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def run_ranks(*target, nproc=2, timeout=300):
    """``python TARGET...`` (a script and its arguments, or ``-m MODULE ...``) as ``nproc`` ranks of
    bert_of's own launcher, as the product runs them (``python -m bert_of.launch --job``: a free
    rendezvous port, the job's exit status and one error line naming a failed rank)."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env["PYTHONPATH"] = ROOT
    cmd = [sys.executable, "-m", "bert_of.launch", "--job", str(nproc), "1", "0", "127.0.0.1", "0", *map(str, target)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _run_in_process(args, extra_env):
    """``bert-of ARGS`` as ``python -m bert_of.cli`` runs it, without a new interpreter: the same
    entry point, working directory and environment a subprocess would get (restored afterwards, with
    this process's signal handlers). stdout and stderr are captured at the file descriptors, so what
    native code (OneFlow, TensorFlow) and child processes write is seen as in a subprocess; an
    exception escaping main() is printed as Python would print it and gives exit status 1."""
    from bert_of import cli

    env, cwd, argv = dict(os.environ), os.getcwd(), sys.argv
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    set_environ({**dict.fromkeys(RANK_VARS), **extra_env})  # with OneFlow drained (tests/e2e/test_stress.py)
    os.chdir(ROOT)
    sys.argv = [os.path.join(ROOT, "bert_of", "cli.py"), *args]
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        for f in (sys.stdout, sys.stderr):
            f.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(fo.fileno(), 1)
        os.dup2(fe.fileno(), 2)
        out = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        err = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = cli.main(args)
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                    if not isinstance(e.code, (int, type(None))):
                        print(e.code, file=sys.stderr)
                except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught one
                    traceback.print_exc()
                    code = 1
        finally:
            for f in (out, err):
                f.close()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            os.chdir(cwd)
            sys.argv = argv
            # through bert_of's one writer: OneFlow's threads call getenv for every kernel, and a
            # setenv under them crashed the test process (bert_of.runtime.process.set_environ)
            set_environ({**dict.fromkeys(set(os.environ) - set(env)), **env})
            for s, h in handlers.items():
                signal.signal(s, h)
            setup_logging(0)
            allow_bars(True)
        fo.seek(0)
        fe.seek(0)
        stdout, stderr = (f.read().decode("utf-8", "replace") for f in (fo, fe))
    return subprocess.CompletedProcess(["bert-of", *args], code, stdout, stderr)


def error_lines(stderr):
    """The lines a user sees, minus OneFlow/TF start-up chatter."""
    noise = ("W2026", "I2026", "E2026", "libibverbs", "WARNING:tensorflow", "oneDNN", "To enable", "cpu_feature_guard")
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith(noise) and "tensorflow/core" not in l]


# --------------------------------------------------------------------------- tiers and the core suite
# Tiers by place: tests/unit/ (no subprocess, no ranks, each well under a second), tests/integration/
# (the CLI in process on small models), tests/e2e/ (subprocesses, ranks, soaks, TensorFlow). Each test
# is marked with its folder's tier (`-m unit`, ...); `make test-fast` runs tests/unit.
#
# `make test` runs the suite twice: in .venv (Python 3.10, OneFlow, TensorFlow) and, with --core, in
# .venv-core (the newest Python here, NumPy 2, neither OneFlow nor TensorFlow: `pip install bert_of`).
# --core runs every test not marked `oneflow` or `tf`: a file whose module needs OneFlow or TensorFlow
# says so with `pytestmark = pytest.mark.oneflow` (or tf), a single test with the decorator. A test
# --core collects that needs OneFlow fails there: it is never skipped (OneFlow cannot be imported).
TIERS = ("unit", "integration", "e2e")


def pytest_addoption(parser):
    parser.addoption("--core", action="store_true",
                     help="the core suite: every test not marked oneflow or tf (tests/conftest.py)")
    parser.addoption("--cpu-times", metavar="FILE",
                     help="write each test's CPU seconds (this process and the children it waited for: "
                          "what a busy machine cannot inflate) and wall seconds to FILE, slowest first")


_CPU_TIMES: dict = {}


def _cpu_now() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """--cpu-times: the CPU seconds of setup + call + teardown (a module fixture's cost lands on
    the first test using it, as --durations shows it)."""
    if not item.config.getoption("--cpu-times"):
        yield
        return
    cpu, wall = _cpu_now(), time.perf_counter()
    yield
    _CPU_TIMES[item.nodeid] = (_cpu_now() - cpu, time.perf_counter() - wall)


def pytest_sessionfinish(session):
    path = session.config.getoption("--cpu-times")
    if not path or not _CPU_TIMES:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # pytest-xdist: one file per worker, merged by the Makefile
    with open(f"{path}.{worker}" if worker else path, "w") as f:
        for nodeid, (cpu, wall) in sorted(_CPU_TIMES.items(), key=lambda kv: -kv[1][0]):
            f.write(f"{cpu:8.2f} {wall:8.2f} {nodeid}\n")


_FILE_MARK = re.compile(r"^pytestmark = .*\bpytest\.mark\.(oneflow|tf)\b", re.M)


def pytest_ignore_collect(collection_path, config):
    """--core does not import a file marked whole oneflow or tf (its imports need them)."""
    if config.getoption("--core") and collection_path.suffix == ".py" and collection_path.name.startswith("test_") \
            and _FILE_MARK.search(collection_path.read_text(encoding="utf-8")):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = next((t for t in TIERS if t in item.path.parts[-3:-1]), None)
        if tier:
            item.add_marker(tier)
    if config.getoption("--core"):
        dropped = [i for i in items if i.get_closest_marker("oneflow") or i.get_closest_marker("tf")]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            kept = set(map(id, items)) - set(map(id, dropped))
            items[:] = [i for i in items if id(i) in kept]
