"""Evaluation inputs that degrade, not die: absurd nesting, NUL and other odd bytes in TSVs, NaN
no-answer probabilities. Each is one line naming the file (and line), exit 1, nothing recorded.
Real files through the real command line."""

import json
import os

import pytest

from tests.conftest import ROOT, error_lines, run_cli

SQUAD = os.path.join(ROOT, "tests", "data", "squad")
GLUE = os.path.join(ROOT, "tests", "data", "glue")
V20, P20, NA20 = (os.path.join(SQUAD, n) for n in ("dev-v2.0-mini.json", "predictions-v2.0.json",
                                                   "na-probs-v2.0.json"))


def _fails(tmp_path, *args, needle):
    results = tmp_path / "results.jsonl"
    r = run_cli("eval", *args, "--results", results, check=False, timeout=120)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and needle in lines[0], (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and not results.exists()  # nothing recorded
    return lines[0]


def _nested(depth):
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("which", ["data", "predictions", "na-probs"])
def test_absurdly_nested_squad_json_is_one_line(tmp_path, which):
    deep = tmp_path / "deep.json"
    inner = '{"a": ' * 200_000 + "1" + "}" * 200_000
    if which == "data":
        deep.write_text('{"version": "v2.0", "data": ' + _nested(200_000) + "}")
        args = ("--data", deep, "--predictions", P20, "--na-prob-file", NA20)
    elif which == "predictions":
        deep.write_text('{"a1": ' + inner + "}")
        args = ("--data", V20, "--predictions", deep, "--na-prob-file", NA20)
    else:
        deep.write_text(inner)
        args = ("--data", V20, "--predictions", P20, "--na-prob-file", deep)
    line = _fails(tmp_path, "squad-score", *args, needle=str(deep))
    assert "nested too deeply" in line


def test_nan_no_answer_probabilities_are_refused_before_scoring(tmp_path):
    na = json.load(open(NA20))
    nan = tmp_path / "na-nan.json"
    nan.write_text(json.dumps({k: float("nan") for k in na}))  # Python writes NaN, as a careless tool would
    line = _fails(tmp_path, "squad-score", "--data", V20, "--predictions", P20, "--na-prob-file", nan, needle=str(nan))
    assert "expected a finite number" in line
    inf = tmp_path / "na-inf.json"
    inf.write_text(json.dumps(dict(na, a3=float("inf"))))
    _fails(tmp_path, "squad-score", "--data", V20, "--predictions", P20, "--na-prob-file", inf, needle="value for 'a3' is inf")
    _fails(tmp_path, "squad-score", "--data", V20, "--predictions", P20, "--na-prob-file", NA20, "--na-prob-thresh", "nan",
           needle="--na-prob-thresh nan: expected a finite number")
    # the same files without the NaN score and record (the refusal is about the values, not the files)
    results = tmp_path / "ok.jsonl"
    r = run_cli("eval", "squad-score", "--data", V20, "--predictions", P20, "--na-prob-file", NA20, "--results", results)
    assert json.loads(r.stdout)["total"] == 5 and len(results.read_text().splitlines()) == 1


def _damaged(tmp_path, name, line_index, insert: bytes):
    lines = open(os.path.join(GLUE, name), "rb").read().split(b"\n")
    lines[line_index] = lines[line_index][:12] + insert + lines[line_index][12:]
    out = tmp_path / name
    out.write_bytes(b"\n".join(lines))
    return out


@pytest.mark.parametrize("insert,needle", [(b"\x00", "line 4: not readable as TSV (line contains NUL)"),
                                           (b"\xff\xfe", "line 4: not UTF-8 text")])
def test_odd_bytes_in_a_tsv_name_the_file_and_line(tmp_path, insert, needle):
    bad = _damaged(tmp_path, "mrpc-dev.tsv", 3, insert)
    _fails(tmp_path, "glue-score", "--task", "mrpc", "--data", bad, "--predictions",
           os.path.join(GLUE, "mrpc-preds.tsv"), needle=f"{bad}: {needle}")


def test_a_non_finite_regression_label_names_the_line(tmp_path):
    lines = open(os.path.join(GLUE, "sts-b-dev.tsv")).read().split("\n")
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\tnan"
    bad = tmp_path / "sts-b-dev.tsv"
    bad.write_text("\n".join(lines))
    _fails(tmp_path, "glue-score", "--task", "sts-b", "--data", bad, "--predictions",
           os.path.join(GLUE, "sts-b-preds.txt"), needle=f"{bad}: line 3: STS-B score 'nan' is not a finite number")
