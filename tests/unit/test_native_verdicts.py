"""native.Verdicts: the kernels' first-use check verdicts kept beside the built library they checked
(bert_of/runtime/native.py), keyed by the library's bytes, the CPU and the caller's context; a file
that is missing, damaged or unwritable costs a check, never a wrong answer or an error."""

import json
import os

from bert_of.runtime import native


def _library(tmp_path, content=b"\x7fELF a built library"):
    path = tmp_path / "cpu_kernels-0123.so"
    path.write_bytes(content)
    return str(path)


def _counting(verdict):
    runs = []

    def run():
        runs.append(1)
        return verdict
    return run, runs


def test_a_verdict_is_checked_once_then_read_from_beside_the_library(tmp_path):
    lib = _library(tmp_path)
    run, runs = _counting({"why": None, "ulps": {"0": 1.5}})
    first = native.Verdicts(lib, {"oneflow": "0.9.0", "threads": 2})
    assert first.check("gelu", run) == {"why": None, "ulps": {"0": 1.5}} and len(runs) == 1 and first.hits == 0
    again = native.Verdicts(lib, {"oneflow": "0.9.0", "threads": 2})
    assert again.check("gelu", run) == {"why": None, "ulps": {"0": 1.5}} and len(runs) == 1 and again.hits == 1
    off, off_runs = _counting("off: differs")
    assert again.check("layer", off) == "off: differs" and again.check("layer", off) == "off: differs"
    assert len(off_runs) == 1  # a kernel that failed its check is not checked again either
    kept = json.loads((tmp_path / "cpu_kernels-0123.so.checks.json").read_text())
    assert list(kept) == [again.key] and kept[again.key] == {"gelu": {"why": None, "ulps": {"0": 1.5}},
                                                             "layer": "off: differs"}


def test_another_library_context_or_recheck_runs_the_check_again(tmp_path, monkeypatch):
    lib = _library(tmp_path)
    run, runs = _counting(None)
    native.Verdicts(lib, {"oneflow": "0.9.0"}).check("heads", run)
    native.Verdicts(lib, {"oneflow": "0.9.1"}).check("heads", run)  # another OneFlow
    assert len(runs) == 2
    _library(tmp_path, b"\x7fELF rebuilt")  # the same name, other bytes
    native.Verdicts(lib, {"oneflow": "0.9.0"}).check("heads", run)
    assert len(runs) == 3
    monkeypatch.setenv(native.RECHECK, "1")
    native.Verdicts(lib, {"oneflow": "0.9.0"}).check("heads", run)
    assert len(runs) == 4
    monkeypatch.delenv(native.RECHECK)
    native.Verdicts(lib, {"oneflow": "0.9.0"}).check("heads", run)
    assert len(runs) == 4
    kept = json.loads((tmp_path / "cpu_kernels-0123.so.checks.json").read_text())
    assert len(kept) <= native.KEEP_KEYS


def test_a_damaged_or_unwritable_file_costs_a_check_not_an_error(tmp_path):
    lib = _library(tmp_path)
    store = tmp_path / "cpu_kernels-0123.so.checks.json"
    run, runs = _counting(None)
    for damaged in (b"{not json", b"[1, 2]", b'{"x": 3}', b"\xff\xfe", b""):
        store.write_bytes(damaged)
        native.Verdicts(lib, {}).check("heads", run)
    assert len(runs) == 5
    entry = next(iter(json.loads(store.read_text()).values()))
    store.write_text(json.dumps({native.Verdicts(lib, {}).key: "not a dict"}))
    native.Verdicts(lib, {}).check("heads", run)
    assert len(runs) == 6 and entry == {"heads": None}
    store.unlink()
    store.mkdir()  # a path that can be neither read nor replaced by a file (even as root)
    v = native.Verdicts(lib, {})
    assert v.check("heads", run) is None and v.check("heads", run) is None and len(runs) == 8
    assert store.is_dir() and sorted(os.listdir(tmp_path)) == ["cpu_kernels-0123.so", store.name]
