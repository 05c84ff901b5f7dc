"""A library whose import does nothing; a command's process set up by one explicit call.

``import bert_of``, ``from bert_of import BertModel`` and a first model (which imports OneFlow)
leave the process as they found it: the signal dispositions as the kernel has them (OneFlow's
liboneflow installs a C SIGINT handler that Python's ``signal.getsignal`` does not see), the
signal mask, fds 0-2 and os.environ. ``bert_of.runtime.process.setup()`` is what a command line does."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY

pytestmark = pytest.mark.oneflow

# What the process looks like, printed as JSON: each signal's disposition as sigaction() reports it
# (handler address and flags), the blocked set, what fds 0-2 are, the environment.
_SNAPSHOT = r"""
import ctypes, json, os, signal, sys

class _SigAction(ctypes.Structure):  # glibc's struct sigaction on Linux
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]

_libc = ctypes.CDLL(None, use_errno=True)

def snapshot():
    sigs = {}
    for s in range(1, 32):
        if s in (signal.SIGKILL, signal.SIGSTOP):
            continue
        sa = _SigAction()
        assert _libc.sigaction(s, None, ctypes.byref(sa)) == 0
        sigs[s] = [sa.handler or 0, sa.flags, repr(signal.getsignal(s))]
    fds = {}
    for fd in (0, 1, 2):
        try:
            st = os.fstat(fd)
            fds[fd] = [st.st_dev, st.st_ino, st.st_mode, os.readlink(f"/proc/self/fd/{fd}")]
        except OSError as e:
            fds[fd] = str(e)
    return {"signals": sigs, "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            "fds": fds, "environ": dict(os.environ)}
"""


def _run(body, env=None):
    code = _SNAPSHOT + "\nout = {'start': snapshot()}\n" + body + "\nprint(json.dumps(out))\n"
    env = dict(os.environ if env is None else env, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1]), r.stderr


def _differences(a, b):
    out = []
    for key in a:
        if isinstance(a[key], dict):
            for k in sorted(set(a[key]) | set(b[key])):
                if a[key].get(k) != b[key].get(k):
                    out.append(f"{key}[{k}]: {a[key].get(k)!r} -> {b[key].get(k)!r}")
        elif a[key] != b[key]:
            out.append(f"{key}: {a[key]!r} -> {b[key]!r}")
    return out


def test_importing_bert_of_and_using_a_model_leaves_the_process_as_it_was():
    body = (
        "import bert_of\n"
        "out['import bert_of'] = snapshot()\n"
        "from bert_of import BertConfig, BertModel\n"
        "out['from bert_of import BertModel'] = snapshot()\n"
        f"m = BertModel(BertConfig.from_google_dict({TINY!r})); m.init_weights(); m.eval()\n"
        "import numpy as np, oneflow as flow\n"
        "ids = flow.tensor(np.arange(12).reshape(2, 6) % 90, dtype=flow.int64)\n"
        "h = m(ids).last_hidden_state.numpy()\n"
        "assert h.shape == (2, 6, 32), h.shape\n"
        "out['a model built and run'] = snapshot()\n")
    # Rank variables absent (OneFlow adds its own then), and an unusual SIGTERM handler to keep.
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "CUDA_MODULE_LOADING", "GLOG_minloglevel")}
    out, err = _run("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); out['start'] = snapshot()\n" + body,
                  env)
    start = out.pop("start")
    assert start["signals"][str(int(15))][2] == "<Handlers.SIG_IGN: 1>"  # the control: the snapshot sees it
    for step, now in out.items():
        assert _differences(start, now) == [], step
    # OneFlow's start-up noise is not a Python program's either (liboneflow's line on fd 2)
    assert "libibverbs" not in err and "CUDA driver version" not in err, err


def test_oneflow_import_in_a_set_up_process_keeps_the_environment_and_drops_only_its_start_up_line():
    out, err = _run("from bert_of.runtime import process\nprocess.setup()\nout['set up'] = snapshot()\n"
                    "import bert_of._flow\nout['oneflow'] = snapshot()\n"
                    "print('a real error', file=sys.stderr)\n")
    start, set_up, after = out["start"], out["set up"], out["oneflow"]
    changed = _differences(start, set_up)  # setup() sets the command's SIGINT / SIGTERM handlers, nothing else
    assert len(changed) == 2 and all(c.startswith(("signals[2]", "signals[15]")) for c in changed), changed
    assert "_on_signal" in set_up["signals"]["2"][2]
    assert _differences(set_up, after) == []  # OneFlow's handler and variables undone
    assert "libibverbs" not in err and "a real error" in err


def test_ctrl_c_while_python_imports_bert_of_is_one_line_and_no_traceback():
    """Ctrl-C from bert_of's first line on, Python's imports included (bert_of/__init__ takes SIGINT
    before importing anything when it is a command line's first import): one line and an end by
    SIGINT, or (signalled before bert_of's first line) Python's own start-up, whose traceback runs
    through no bert_of file. Delays spread over the whole start-up (~0.3 s), every 10 ms."""
    import signal
    import time

    ours = 0
    for i in range(30):
        p = subprocess.Popen([sys.executable, "-m", "bert_of.cli", "inspect", os.path.join(ROOT, "tests", "data",
                                                                                           "hf", "tiny_pt")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        time.sleep(i * 0.01)  # when the signal lands; every outcome below is checked, none waited for
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
        if p.returncode == 0:  # finished before the signal
            continue
        frames = [l for l in err.splitlines() if l.strip().startswith('File "')]
        assert not [f for f in frames if f'"{ROOT}{os.sep}' in f and f"{os.sep}.venv" not in f], (i, err)
        if "Traceback" not in err:  # (nothing said: the signal came before Python's handler, its default killed)
            assert p.returncode == -signal.SIGINT and err.splitlines() in ([], ["bert-of: error: interrupted"]), \
                (i, err)
            ours += bool(err)
    assert ours >= 10  # most of the start-up is bert_of's own imports


def test_oneflows_vm_setting_is_read_during_the_import_and_a_users_value_is_kept():
    """bert_of has OneFlow's CPU streams run kernels on the VM scheduler thread by letting OneFlow
    read ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD=0 during the import only (its effect is measured in
    bench/, docs/ranks.md); os.environ is left as it was, and a value the user set stays theirs."""
    code = ("import os\nfrom bert_of._flow import flow\n"
            "y = (flow.ones(4) * 2).numpy()\n"
            "print(os.environ.get('ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD'), float(y.sum()))\n")
    for value, want in ((None, "None 8.0"), ("1", "1 8.0")):
        env = {k: v for k, v in os.environ.items() if k != "ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD"}
        if value:
            env["ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD"] = value
        p = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        assert p.stdout.split("\n")[-2] == want
