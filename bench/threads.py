"""Per-thread CPU time of a process, and what each OneFlow thread is (from a native stack).

    from threads import thread_cpu, thread_roles
    roles = thread_roles(os.getpid())   # {tid: "vm-scheduler" | "vm-worker" | ...} (gdb, ~2 s pause)
    before = thread_cpu(); ...; after = thread_cpu()

Used by bench/pretrain_worker.py --thread-report: where a rank's CPU time goes, thread by thread.
Roles come from the frames of ``gdb -batch -ex "thread apply all bt"`` (OneFlow 0.9's symbols):
VirtualMachine::ScheduleLoop is the VM scheduler, WorkerLoop (CreateThreadCtx) a stream worker that
runs eager kernels, oneflow::Thread / Actor an nn.Graph actor thread that runs the graph's kernels,
ThreadPool / EpollLoop / Transport / CommNet its pools and transport threads.
"""

import os
import re
import subprocess

ROLES = (  # first match in a thread's frames wins
    ("vm-scheduler", "VirtualMachine::ScheduleLoop"),
    ("vm-worker", "WorkerLoop"),
    ("vm-worker", "ThreadCtx::TryReceiveAndRun"),
    ("vm-worker", "VirtualMachine::CreateThreadCtx"),
    ("graph-actor", "oneflow::Thread::"),  # nn.Graph's actor threads: its kernels run here
    ("graph-actor", "oneflow::Actor::"),
    ("thread-pool", "ThreadPool::ThreadPool"),
    ("io-poller", "IOEventPoller::EpollLoop"),
    ("transport", "Transport::PollMsgChannel"),
    ("comm-net", "CommNet::CommNet"),
    ("grpc", "grpc"),
    ("openmp", "gomp"),
    ("openmp", "__kmp"),
    ("onednn", "dnnl"),
)


def thread_cpu(pid="self") -> dict:
    """{tid: CPU seconds (user + system)} of every thread of ``pid``."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(rest[11]) + int(rest[12])) / tick
    return out


def thread_roles(pid: int, timeout: float = 60) -> dict:
    """{tid: role} from one gdb snapshot of ``pid``'s native stacks (the process pauses meanwhile);
    {} when gdb is missing or cannot attach."""
    try:
        p = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 40"], capture_output=True,
                           text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    roles, tid, frames = {}, None, []

    def close():
        if tid is not None:
            text = "\n".join(frames)
            roles[tid] = "python-main" if tid == pid else next((r for r, k in ROLES if k in text), "other")

    for line in p.stdout.splitlines():
        m = re.match(r"Thread \d+ \(Thread 0x[0-9a-f]+ \(LWP (\d+)\)", line)
        if m:
            close()
            tid, frames = int(m.group(1)), []
        elif line.startswith("#"):
            frames.append(line)
    close()
    return roles


def by_role(cpu0: dict, cpu1: dict, roles: dict) -> dict:
    """CPU seconds between two thread_cpu() readings, summed per role (threads gdb did not see:
    "unknown")."""
    out = {}
    for tid, c in cpu1.items():
        role = roles.get(tid, "unknown")
        out[role] = round(out.get(role, 0.0) + c - cpu0.get(tid, 0.0), 3)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
