"""The command-line grammar (bert_of/cli_grammar.py) and what the user sees on stderr.

Every command's --help: help text for every option, defaults shown, examples, no markup; every
option of a command whose parser is generated from its options dataclass is a field of it, and
no help text writes a default (the help shows the field's). The removed old spellings are errors.
--version. -q leaves errors only; progress is a bar on a terminal and plain lines in a pipe (no
carriage returns); OneFlow's start-up line is gone.
"""

import argparse
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from bert_of.cli import build_parser
from bert_of.cli_grammar import GRAMMAR, HelpFormatter, walk
from bert_of.version import __version__
from tests.conftest import ROOT, run_cli

HF_TINY = os.path.join(ROOT, "tests", "data", "hf", "tiny_pt")
SQUAD = os.path.join(ROOT, "tests", "data", "squad")

MARKUP = re.compile(r"``|:(mod|class|func|meth|attr):`|\*\*\w")


def commands():
    return {path: p for path, p in walk(build_parser())}


def problems(path, p) -> list:
    """What is missing or wrong in one command's help."""
    name = " ".join(("bert-of",) + path)
    out = []
    if not p.epilog or "examples:" not in p.epilog:
        out.append(f"{name}: no examples in its help")
    formatter = HelpFormatter(prog=name)
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        if a.help == argparse.SUPPRESS:
            continue  # an old spelling or a test-only option
        shown = a.option_strings or [a.dest]
        if not (a.help or "").strip():
            out.append(f"{name} {shown[0]}: no help text")
            continue
        default = getattr(a, "field_default", a.default)
        if a.option_strings and default is not None and not isinstance(default, bool) \
                and default is not argparse.SUPPRESS and default != [] \
                and "default" not in formatter._get_help_string(a).lower():
            out.append(f"{name} {shown[0]}: default {default!r} not shown")
    text = p.format_help()
    if MARKUP.search(text):
        out.append(f"{name}: markup in the help text: {MARKUP.search(text).group(0)!r}")
    return out


def test_every_command_has_help_for_every_option_defaults_and_examples():
    found = [msg for path, p in commands().items() for msg in problems(path, p)]
    assert not found, "\n".join(found)
    assert len(commands()) >= 30  # the walk reaches the nested commands (zoo download, eval squad, ...)


# Commands whose parser is still written by hand (not generated from an options dataclass): none.
# The test below fails when a command is added without one.
NOT_CONVERTED = set()
COMMON = {"help", "quiet", "verbose", "no_progress", "debug"}  # cli_grammar.finish adds these to every command
DEFAULT_IN_HELP = re.compile(r"\bdefaults?\b", re.I)


def _leaves(cmds) -> dict:
    return {path: p for path, p in cmds.items()
            if path and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)}


def test_every_option_is_a_field_of_its_commands_options_and_no_help_writes_a_default():
    from bert_of.options import option_fields

    leaves = _leaves(commands())
    generated = {path for path, p in leaves.items() if hasattr(p, "options")}
    assert set(leaves) - generated == NOT_CONVERTED, "update NOT_CONVERTED: " + repr(set(leaves) - generated)
    assert {("pretrain",), ("finetune", "squad"), ("finetune", "glue"), ("predict", "squad"), ("predict", "glue"),
            ("eval", "squad"), ("eval", "glue")} <= generated
    found = []
    for path in sorted(generated):
        p, name = leaves[path], "bert-of " + " ".join(path)
        cls, command = p.options
        fields = {f.name: f for f in option_fields(cls, command).values()}
        dests = set()
        for a in p._actions:
            if a.dest in COMMON or isinstance(a, argparse._HelpAction):
                continue
            dests.add(a.dest)
            if a.dest not in fields:
                found.append(f"{name} {a.option_strings or a.dest}: not a field of {cls.__name__}")
            if a.help and a.help != argparse.SUPPRESS and DEFAULT_IN_HELP.search(a.help):
                found.append(f"{name} {a.option_strings[0]}: its help writes a default ({a.help!r}); the field's "
                             "is shown")
            f = fields.get(a.dest)
            # (a choice's name in its help explains the choices, e.g. "adamw: Google's ...")
            if f is not None and a.help and f.default not in (None, False, True, 0, "", *(a.choices or ())) and \
                    re.search(rf"(?<![\w.]){re.escape(str(f.default))}(?![\w.])", a.help):
                found.append(f"{name} {a.option_strings[0]}: its help repeats the default {f.default!r}")
        found += [f"{name}: field {n} of {cls.__name__} has no option" for n in sorted(set(fields) - dests)]
    assert not found, "\n".join(found)


REMOVED = [  # old spellings, a positional DST, a hidden --progress: 0.1.0 keeps none of them
    ["convert", "tf2of", "src", "dst"],
    ["verify", "a", "b", "--json", "r.json"], ["verify", "a", "b", "--seq-len", "8"],
    ["pretrain", "--data", "d", "-o", "r", "--grad-accum", "2"], ["pretrain", "--data", "d", "-o", "r", "--seq-length", "64"],
    ["pretrain", "--data", "d", "-o", "r", "--max-predictions", "5"],
    ["plot", "run", "--out", "x.png"], ["align", "eager-graph", "--out", "a"],
    ["eval", "squad-score", "d.json", "p.json"],
    ["eval", "squad-score", "--data", "d", "--predictions", "p", "--out-file", "s.json"],
    ["eval", "squad-score", "--data", "d", "--predictions", "p", "--checkpoint", "ck"],
    ["eval", "squad-score", "--data", "d", "--predictions", "p", "--version", "2.0"],
    ["finetune", "squad", "--model", "m", "--train", "t.json", "-o", "o", "--max-steps", "9"],
    ["finetune", "squad", "--model", "m", "--train", "t.json", "-o", "o", "--version", "2.0"],
    ["zoo", "add", "dir", "--name", "n", "--force"], ["zoo", "download", "n", "--progress"],
    ["selftest", "--json", "s.json"],
]


@pytest.mark.parametrize("argv", REMOVED, ids=lambda a: " ".join(a[:2]))
def test_removed_spellings_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and ("unrecognized arguments" in err or "are required" in err), err


def test_version_and_top_level_examples():
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "--version"], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0 and r.stdout.strip() == f"bert-of {__version__}" and not r.stderr
    top = build_parser().format_help()
    assert "examples:" in top and "bert-of eval squad" in top and "bert-of convert tf2of" in top


def test_the_flag_table_lists_every_concept():
    # The table lives in docs/command-line.md (the README links to it).
    from bert_of.cli_grammar import grammar_markdown

    table = grammar_markdown().splitlines()
    assert len(table) == len(GRAMMAR) + 2 and all(row.count("|") == 4 for row in table)
    assert grammar_markdown() in open(os.path.join(ROOT, "docs", "command-line.md"), encoding="utf-8").read()


# --------------------------------------------------------------------------- what stderr shows


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERT_OF_")}
    env.update(PYTHONPATH=ROOT, **extra)
    return env


def test_piped_progress_is_plain_lines_without_carriage_returns(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "convert", "hf2of", HF_TINY, "-o", tmp_path / "of"],
                       capture_output=True, env=_env(BERT_OF_PROGRESS_EVERY="0"), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert "\r" not in err and "\r" not in r.stdout.decode()
    lines = [ln for ln in err.splitlines() if ln.startswith("hf2of: ")]
    assert lines and lines[-1].endswith("(done)") and "(100%)" in lines[-1], err


def test_a_terminal_gets_a_bar_and_no_progress_turns_it_off(tmp_path):
    def on_a_terminal(*extra, env=None):
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a size
        p = subprocess.Popen([sys.executable, "-m", "bert_of.cli", "convert", "hf2of", HF_TINY, *extra],
                             stdout=subprocess.PIPE, stderr=follower, env=env or _env(), cwd=ROOT)
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 1 << 16)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        p.wait(timeout=120)
        os.close(leader)
        assert p.returncode == 0, b"".join(chunks)
        return b"".join(chunks).decode(errors="replace")

    assert "\r" in on_a_terminal("-o", tmp_path / "a")  # tqdm redraws in place
    assert "\r" not in on_a_terminal("-o", tmp_path / "b", "--no-progress")
    assert "\r" not in on_a_terminal("-o", tmp_path / "c", env=_env(BERT_OF_DISABLE_PROGRESS_BARS="1"))
    assert "\r" not in on_a_terminal("-o", tmp_path / "d", "-q")


def test_quiet_leaves_only_errors(tmp_path):
    data, preds = os.path.join(SQUAD, "dev-v1.1-mini.json"), os.path.join(SQUAD, "predictions-v1.1.json")
    home = tmp_path / "home"
    loud = run_cli("eval", "squad-score", "--data", data, "--predictions", preds, "--results", home / "r.jsonl")
    assert "recorded in" in loud.stderr
    quiet = run_cli("-q", "eval", "squad-score", "--data", data, "--predictions", preds, "--results", home / "r.jsonl")
    assert quiet.stderr == "" and json.loads(quiet.stdout) == json.loads(loud.stdout)
    # a command that loads OneFlow and converts: results on stdout, nothing on stderr
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "convert", "hf2of", HF_TINY, "-o", tmp_path / "of",
                        "--verify", "-q"], capture_output=True, text=True, env=_env(BERT_OF_PROGRESS_EVERY="0"),
                       cwd=ROOT)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", (r.stdout, r.stderr)  # -q: errors only
    # errors still show, as one line
    r = run_cli("convert", "hf2of", HF_TINY, "-o", tmp_path / "of", "-q", check=False)
    assert r.returncode == 1 and r.stderr.splitlines() == [f"bert-of: error: {tmp_path / 'of'}: already exists "
                                                           "(use --overwrite to replace it)"]


def test_verbose_lists_every_tensor(tmp_path):
    short = run_cli("convert", "hf2of", HF_TINY, "-o", tmp_path / "a").stdout
    long = run_cli("convert", "hf2of", HF_TINY, "-o", tmp_path / "b", "-v").stdout
    assert "  mapped    " not in short and long.count("  mapped    ") > 20


@pytest.mark.oneflow
def test_oneflow_start_up_line_is_gone():
    """In a command's process (bert_of.runtime.process.setup: the library alone touches no fd)."""
    r = subprocess.run([sys.executable, "-c", "from bert_of.runtime import process; process.setup(); import bert_of._flow; "
                        "import sys; print('real error', file=sys.stderr)"],
                       capture_output=True, text=True, env=_env(), cwd=ROOT)
    assert r.returncode == 0 and "libibverbs" not in r.stderr and "real error" in r.stderr


def test_results_with_an_unknown_task_is_an_error(tmp_path):
    r = run_cli("results", "--task", "squad-v1", "--results", tmp_path / "r.jsonl", check=False)
    assert r.returncode == 1 and r.stderr.splitlines()[0].startswith(
        "bert-of: error: --task 'squad-v1': unknown task (did you mean squad-v1.1?)")
    assert run_cli("results", "--task", "mrpc", "--results", tmp_path / "r.jsonl").returncode == 0


def test_ctrl_c_leaves_nothing_partial(tmp_path):
    """SIGINT while `convert --verify` checks the staged files: one line, nothing at DST, no staging
    folder left behind."""
    from tests.helpers.models import minilm_dir

    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "bert_of.cli", "convert", "hf2of", minilm_dir(), "-o", out / "of",
                          "--verify"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    def staged_a_file():
        try:
            return any(os.listdir(os.path.join(out, d)) for d in os.listdir(out))
        except OSError:  # the staging folder was just renamed: finished
            return False

    deadline = time.monotonic() + 120
    # the staging folder holds a written file: converting or verifying (the verify takes seconds)
    while p.poll() is None and time.monotonic() < deadline and not staged_a_file():
        time.sleep(0.01)  # polling for the staged file
    assert p.poll() is None, "finished before it could be interrupted"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "interrupted" in err.strip().splitlines()[-1], err
    assert "Traceback" not in err and os.listdir(out) == []


def test_coinciding_curves_get_their_own_colours_dashed_over_solid():
    from bert_of.plots import styles

    eager = [7.5, 7.2, 7.0, 6.8, 6.7]
    curves = {"eager": eager, "graph": list(eager), "2 ranks": [x + 1e-4 for x in eager],
              "no clipping": [x - 0.5 for x in eager]}
    st = styles(curves)
    assert len({s["color"] for s in st.values()}) == 4
    assert st["eager"]["ls"] == "-" and st["no clipping"]["ls"] == "-"
    assert st["graph"]["label"] == "graph (identical to eager)"
    assert st["2 ranks"]["label"] == "2 ranks (coincides with eager)"
    assert st["graph"]["ls"] != "-" and st["2 ranks"]["ls"] != "-" and st["graph"]["ls"] != st["2 ranks"]["ls"]
    assert min(st["graph"]["zorder"], st["2 ranks"]["zorder"]) > st["eager"]["zorder"]  # drawn over it


# --------------------------------------------------------------------------- the anchors' habits


ANCHOR_SPELLINGS = [  # (command line, the flag the one error line must name)
    (["finetune", "squad", "--max_seq_length", "64", "--model", "m", "--train", "t.json"], "--max-seq-length"),
    (["finetune", "glue", "--learning_rate", "2e-5"], "--lr"),
    (["finetune", "classify", "--num_train_epochs", "3"], "--epochs"),
    (["finetune", "tag", "--output_dir", "x"], "--output"),
    (["finetune", "squad", "--model_name_or_path", "m"], "--model"),
    (["finetune", "squad", "--init_checkpoint", "m"], "--model"),
    (["pretrain", "--init_checkpoint", "m"], "--init-checkpoint"),
    (["finetune", "squad", "--per_device_train_batch_size", "8"], "--batch-size"),
    (["pretrain", "--train_batch_size", "8"], "--batch-size"),
    (["data", "create-pretraining", "--input_file=corpus.txt"], "--input"),
    (["data", "create-pretraining", "--vocab_file", "v.txt"], "--vocab"),
    (["pretrain", "--bert_config_file", "c.json"], "--config"),
    (["predict", "classify", "--do_lower_case"], "--do-lower-case"),
    (["convert", "tf2of", "a", "-o", "b", "--verfy"], "--verify"),
    # NVIDIA's run_pretraining.py and Google's run_classifier.py
    (["pretrain", "--data_dir", "d"], "--data"),
    (["pretrain", "--input_dir", "d"], "--data"),
    (["pretrain", "--num_steps_per_checkpoint", "200"], "--save-every"),
    (["pretrain", "--resume_from_checkpoint"], "--resume"),
    (["pretrain", "--warmup_proportion", "0.01"], "--warmup-steps"),
    (["finetune", "glue", "--warmup_proportion", "0.1"], "--warmup-proportion"),
    (["finetune", "glue", "--bert_config_file", "c.json"], "--model"),
    (["finetune", "classify", "--data_dir", "d"], "--train"),
]


@pytest.mark.parametrize("argv,flag", ANCHOR_SPELLINGS, ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_an_anchor_spelling_or_a_typo_names_our_flag_in_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"(did you mean {flag}?)" in err and "unrecognized arguments" in err, err


def test_a_mistyped_command_and_a_forgotten_direction_say_what_to_type():
    r = run_cli("conver", "tf2of", "a", "-o", "b", check=False, process=True)
    assert r.returncode == 2 and "did you mean 'convert'?" in r.stderr, r.stderr
    r = run_cli("convert", "model_dir", "-o", "out", check=False, process=True)
    assert r.returncode == 2 and "the direction is missing" in r.stderr and "tf2of" in r.stderr, r.stderr
    r = run_cli("convert", "hf2off", "model_dir", "-o", "out", check=False, process=True)
    assert r.returncode == 1 and "did you mean hf2of?" in r.stderr and "h52of" not in r.stderr, r.stderr
    r = run_cli("finetune", "squad", "--max_seq_length", "64", "--model", "m", "--train", "t.json", "-o", "x",
                check=False, process=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "bert-of finetune squad: error: unrecognized arguments: --max_seq_length (did you mean --max-seq-length?); "
        "`bert-of finetune squad --help` lists the options"], r.stderr


def test_googles_do_switches_are_explained(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["finetune", "glue", "--do_train", "--task", "mrpc"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--do_train (bert-of finetune trains; no switch needed)" in err, err


def test_the_anchors_page_lists_the_table_the_parser_uses():
    from bert_of.cli_grammar import anchors_markdown

    assert anchors_markdown() in open(os.path.join(ROOT, "docs", "command-line.md"), encoding="utf-8").read()


@pytest.mark.oneflow
def test_convert_verify_says_one_verdict_line_and_json_gives_the_report_alone(tmp_path):
    """convert --verify: the summary, "wrote", and verify's one-line verdict; --json: stdout is the
    report as JSON (`> r.json` is a JSON file), the summary on stderr; -q: nothing."""
    r = run_cli("convert", "hf2of", HF_TINY, "-o", tmp_path / "a", "--verify")
    lines = r.stdout.splitlines()
    assert lines[-1].startswith(f"verify: ok: {tmp_path / 'a'} (of) computes what ") and "max |diff|" in lines[-1]
    assert lines[-2].startswith(f"wrote {tmp_path / 'a'} (hf2of, verified, ") and "{" not in r.stdout
    r = run_cli("convert", "hf2of", HF_TINY, "-o", tmp_path / "b", "--verify", "--json")
    report = json.loads(r.stdout)
    assert report["ok"] and report["b"]["path"] == str(tmp_path / "b") and f"wrote {tmp_path / 'b'}" in r.stderr
    r = run_cli("convert", "hf2of", HF_TINY, "-o", tmp_path / "c", "--json", check=False)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "bert-of: error: --json prints the verification report: it needs --verify"]


@pytest.mark.parametrize("config", ['"x": ' + "9" * 5000, '"x": ' + "[" * 100_000 + "]" * 100_000])
def test_a_pathological_config_is_one_line_naming_it(tmp_path, config):
    """A 5000-digit integer or 100k-deep nesting in a checkpoint's config.json: one line naming the file."""
    import shutil

    src = tmp_path / "hf"
    shutil.copytree(HF_TINY, src)
    text = json.dumps(json.load(open(src / "config.json")))
    (src / "config.json").write_text(text[:-1] + ", " + config + "}")
    for args in (("inspect", src), ("convert", "hf2of", src, "-o", tmp_path / "of")):
        r = run_cli(*args, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"bert-of: error: {src / 'config.json'}: ")
        assert "internal error" not in lines[0] and not (tmp_path / "of").exists(), lines
