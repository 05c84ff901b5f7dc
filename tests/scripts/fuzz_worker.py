"""Fuzz smoke worker: seeded byte and field mutations of one small checkpoint, each converted by the
real ``bert-of convert`` (``bert_of.cli.main``, in this process so OneFlow and TF load once).

    python tests/scripts/fuzz_worker.py FORMAT SOURCE WORKDIR SEED COUNT REPORT.json

Each case must end in exit 0 with output that ``verify`` accepts against the (mutated) source, or in
exit 1 with exactly one ``bert-of: error:`` line that is not an internal error; never a traceback, a
hang (SIGALRM after 60 s) or files left beside the destination. Before each case the worker writes
its number and mutation to REPORT.json.progress, so a crash (the process dies) is attributable; at the
end REPORT.json holds every outcome.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

# What to mutate in each format: (file, probability weight, header size hint for biased byte flips).
WEIGHT_FILES = {
    "of": ["model.safetensors", "config.json"],
    "hf": ["model.safetensors", "config.json"],
    "tf": ["bert_model.ckpt.index", "bert_model.ckpt.data-00000-of-00001", "bert_config.json"],
    "lazy": ["*/meta", "*/out", "bert_config.json"],
    "h5": ["tf_model.h5", "config.json"],
    "bin": ["pytorch_model.bin", "config.json"],
}
DIRECTION = {"of": "of2hf", "hf": "hf2of", "tf": "tf2of", "lazy": "lazy2of", "h5": "h52of", "bin": "hf2of"}
SPECIAL_INTS = [0, 1, -1, 2, 7, 8, 13, 255, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 63 - 1, 2 ** 64, 10 ** 30]


class Hang(BaseException):  # not an Exception: dispatch must not catch it
    pass


def _alarm(signum, frame):
    raise Hang()


def pick_file(rng, src, fmt):
    pattern = rng.choice(WEIGHT_FILES[fmt])
    if pattern.startswith("*/"):
        dirs = sorted(d for d in os.listdir(src) if os.path.isfile(os.path.join(src, d, pattern[2:])))
        return os.path.join(src, rng.choice(dirs), pattern[2:])
    return os.path.join(src, pattern)


def mutate_bytes(rng, path):
    data = bytearray(open(path, "rb").read())
    kind = rng.choice(["flip", "flip", "set", "truncate", "insert", "zero-run"])
    if not data:
        kind = "insert"
    head = min(len(data), 4096)
    pos = rng.randrange(head) if data and rng.random() < 0.6 else (rng.randrange(len(data)) if data else 0)
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            p = rng.randrange(head) if rng.random() < 0.6 else rng.randrange(len(data))
            data[p] ^= 1 << rng.randrange(8)
    elif kind == "set":
        data[pos] = rng.choice([0, 0xFF, 0x7F, 0x80, ord("9"), ord("-"), ord('"')])
    elif kind == "truncate":
        del data[pos:]
    elif kind == "insert":
        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    else:
        n = rng.randint(1, 64)
        data[pos:pos + n] = bytes(min(n, len(data) - pos))
    open(path, "wb").write(bytes(data))
    return f"{kind}@{pos} {os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}"


def _json_numbers(obj, path=()):
    """Paths of every number (or null) in a JSON value."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_numbers(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _json_numbers(v, path + (i,))
    else:
        yield path


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def mutate_json(rng, obj):
    """A field of a JSON value set to something hostile; returns a description."""
    paths = list(_json_numbers(obj))
    path = rng.choice(paths)
    value = rng.choice(SPECIAL_INTS + [-5, 3.5, 1e300, None, "x", [], {}, True, float("nan")])
    _set(obj, path, value)
    return f"{'/'.join(map(str, path))}={value!r}"


def mutate_field(rng, src, fmt):
    """Format-aware: change one field of a header/config/meta/index/pickle, leaving checksums valid."""
    from tests.helpers import hostile_inputs as hi

    if fmt in ("of", "hf") and rng.random() < 0.7:
        path = os.path.join(src, "model.safetensors")
        text, data = hi.st_header(path)
        header = json.loads(text)
        choice = rng.random()
        if choice < 0.15:  # duplicate a key (JSON text level)
            k = rng.choice([k for k in header if k != "__metadata__"])
            dup = json.dumps({k: header[k]})[1:-1]
            hi.st_write(path, text.rstrip()[:-1] + "," + dup + "}", data)
            return f"duplicate key {k}"
        if choice < 0.3:
            k = rng.choice([k for k in header if k != "__metadata__"])
            header[k]["dtype"] = rng.choice(["I32", "F16", "F64", "BF16", "U8", "BOOL", "F8_E4M3", "X"])
            hi.st_write(path, json.dumps(header), data)
            return f"dtype {k}={header[k]['dtype']}"
        desc = mutate_json(rng, header)
        hi.st_write(path, json.dumps(header), data)
        return "header " + desc
    if fmt == "tf" and rng.random() < 0.7:
        prefix = os.path.join(src, "bert_model.ckpt")
        names = sorted(tf1 for tf1 in __import__("bert_of.converters.containers.tf1_bundle", fromlist=["x"])
                       ._read_index_uncached(prefix)[0])
        target, field = rng.choice(names), rng.choice(["dtype_enum", "shape", "offset", "size", "crc"])
        value = rng.choice(SPECIAL_INTS + [3, 7, 9, 14, 19, 99])
        desc = f"index {target}.{field}={value}"

        def edit(name, f):
            if name == target:
                if field == "shape":
                    shape = list(f["shape"]) or [1]
                    shape[rng.randrange(len(shape))] = value if value < 2 ** 63 else -3
                    f["shape"] = tuple(shape)
                else:
                    f[field] = value % 2 ** (32 if field in ("dtype_enum", "crc") else 64)
            return f

        hi.tf_rewrite_index(prefix, edit)
        return desc
    if fmt == "lazy" and rng.random() < 0.6:
        folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
        path = os.path.join(src, rng.choice(folders), "meta")
        text = rng.choice(["shape {\n  dim: %d\n}\ndata_type: kFloat\n" % rng.choice(SPECIAL_INTS),
                           "shape {\n  dim: 8\n}\ndata_type: %s\n" % rng.choice(["kInt32", "kDouble", "kFloat16",
                                                                                 "kInt8", "kBool", "99", "kChar"]),
                           "shape { dim: 99999999999999999999999 dim: 8 }\ndata_type: kFloat\n",
                           "data_type: kFloat\n", "shape {\n  dim: -1\n}\ndata_type: kFloat\n", ""])
        open(path, "w").write(text)
        return f"meta {os.path.basename(os.path.dirname(path))}: {text!r}"
    if fmt == "h5" and rng.random() < 0.6:
        import h5py
        import numpy as np

        path = os.path.join(src, "tf_model.h5")
        with h5py.File(path, "r+") as f:
            names = []
            f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            name = rng.choice(names)
            what = rng.choice(["dtype", "shape", "attr", "link", "delete"])
            if what == "dtype":
                arr = f[name][()]
                del f[name]
                f.create_dataset(name, data=np.asarray(arr).astype(rng.choice(["i4", "f8", "f2", "u1", "?"])))
            elif what == "shape":
                del f[name]
                f.create_dataset(name, data=np.zeros(rng.choice([(), (0,), (3,), (8, 9), (1, 1, 8)]), "f4"))
            elif what == "attr":
                g = f[rng.choice(["bert", "mlm___cls", "nsp___cls"])] if rng.random() < 0.7 else f
                key = "weight_names" if g is not f else "layer_names"
                vals = [v.decode() if isinstance(v, bytes) else str(v) for v in g.attrs[key]]
                if vals:
                    vals[rng.randrange(len(vals))] = rng.choice(["", "/", "..", "x/y:0", vals[0] + "x"])
                g.attrs[key] = [v.encode() for v in vals]
            elif what == "link":
                del f[name]
                f[name] = h5py.SoftLink("/" + rng.choice(names))
            else:
                del f[name]
        return f"h5 {what} {name}"
    if fmt == "bin" and rng.random() < 0.6:
        import zipfile

        path = os.path.join(src, "pytorch_model.bin")
        with zipfile.ZipFile(path) as z:
            members = {n: z.read(n) for n in z.namelist()}
        pkl = bytearray(members["archive/data.pkl"])
        # change one 4-byte BININT operand (offsets, sizes, strides, numels) to a hostile value
        spots = [i for i in range(len(pkl) - 4) if pkl[i] == ord("J")]
        i = rng.choice(spots)
        value = rng.choice([0, 1, 2, 3, 7, 8, 13, 100, 1000, 2 ** 20, 2 ** 31 - 1, -1, -8])
        pkl[i + 1:i + 5] = value.to_bytes(4, "little", signed=True)
        members["archive/data.pkl"] = bytes(pkl)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            for n, raw in members.items():
                z.writestr(n, raw)
        return f"pickle int@{i}={value}"
    cfg = [c for c in ("config.json", "bert_config.json") if os.path.isfile(os.path.join(src, c))][0]
    path = os.path.join(src, cfg)
    obj = json.load(open(path))
    desc = mutate_json(rng, obj)
    open(path, "w").write(json.dumps(obj))
    return f"{cfg} {desc}"


def run_cli(argv):
    from bert_of import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def check_case(fmt, src, work, i, rng, verify, progress):
    case = os.path.join(work, f"case-{i}")
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(src, os.path.join(case, "src"))
    s = os.path.join(case, "src")
    desc = mutate_field(rng, s, fmt) if rng.random() < 0.5 else mutate_bytes(rng, pick_file(rng, s, fmt))
    progress(desc)
    out = os.path.join(case, "out")
    os.makedirs(out)
    dst = os.path.join(out, "dst")
    rc, stdout, stderr = run_cli(["convert", DIRECTION[fmt], s, "-o", dst])
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    result = {"case": i, "mutation": desc, "rc": rc}
    problems = []
    left = sorted(os.listdir(out))
    if rc == 0:
        if left != ["dst"]:
            problems.append(f"exit 0 but the output folder holds {left}")
        else:
            try:
                report = verify(s, dst, modes=("eager",))
                result["worst"] = report["worst"]
                if not report["ok"]:
                    problems.append(f"exit 0 but verify says max |diff| {report['worst']}")
            except Exception as e:  # noqa: BLE001 - a verify failure on exit-0 output is a finding
                problems.append(f"exit 0 but verify raised {type(e).__name__}: {str(e)[:200]}")
    elif rc == 1:
        result["error"] = lines[0] if lines else ""
        if len(lines) != 1 or not lines[0].startswith("bert-of: error: "):
            problems.append(f"exit 1 but stderr is not one error line: {stderr[-2000:]!r}")
        elif "internal error" in lines[0]:
            problems.append(f"internal error: {lines[0]}")
        if left:
            problems.append(f"exit 1 but the output folder holds {left}")
    else:
        problems.append(f"exit status {rc}: {stderr[-2000:]!r}")
    if problems:
        result["problems"] = problems
    shutil.rmtree(case, ignore_errors=True)
    return result


def main():
    fmt, src, work, seed, count, report_path = sys.argv[1:7]
    first, _, count = count.rpartition(":")  # COUNT or FIRST:COUNT (to replay one case)
    seed, first, count = int(seed), int(first or 0), int(count)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import logging

    logging.disable(logging.WARNING)  # bert_of's warnings are not errors; this worker checks errors
    from bert_of.converters.verify.compare import verify

    signal.signal(signal.SIGALRM, _alarm)
    os.makedirs(work, exist_ok=True)
    results, t0 = [], time.time()
    for i in range(first, first + count):
        rng = random.Random(f"{seed}-{fmt}-{i}")
        state = {"case": i, "seed": seed, "format": fmt}

        def progress(desc):
            state["mutation"] = desc
            with open(report_path + ".progress", "w") as f:
                json.dump(state, f)

        progress(None)
        signal.alarm(60)
        t1 = time.time()
        try:
            results.append(check_case(fmt, src, work, i, rng, verify, progress))
            results[-1]["seconds"] = round(time.time() - t1, 2)
        except Hang:
            results.append(dict(state, problems=["hang: no result within 60 s"]))
        finally:
            signal.alarm(0)
    summary = {"format": fmt, "seed": seed, "count": count, "seconds": round(time.time() - t0, 1),
               "exit0": sum(r.get("rc") == 0 for r in results), "exit1": sum(r.get("rc") == 1 for r in results),
               "failures": [r for r in results if r.get("problems")], "results": results}
    with open(report_path, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    os.remove(report_path + ".progress")


if __name__ == "__main__":
    main()
