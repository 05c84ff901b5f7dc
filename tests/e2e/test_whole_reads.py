"""Whole checkpoints for every reader of every format.

Another process replaces a checkpoint folder between two checkpoints A and B in a loop, the way
``bert-of convert ... --overwrite`` does (bert_of.files.publish.publishing: RENAME_EXCHANGE, then the old tree
deleted), while this one reads it again and again. A and B have the same shapes; they differ in
their tensors' values, their config (initializer_range) and their vocabulary (one token), so a
read mixing them is silent unless checked: every read must be A's config with A's tensors and
A's vocab, or B's with B's, and both must be seen (the race is real, not vacuous). The oracle is
the original bert_of checkpoints, read with numpy from their safetensors files.
"""

import hashlib
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from bert_of.checkpoint import load_checkpoint, load_safetensors, write_checkpoint
from bert_of.tensors import expected_shapes
from bert_of.config import BertConfig
from bert_of.converters import convert as conv
from bert_of.converters.formats import hf, lazy
from bert_of.converters import reader
from bert_of.converters.source import Options
from bert_of.files.publish import publishing, _rename2, _RENAME_EXCHANGE
from bert_of.vocab import read_vocab_lines
from bert_of.zoo import Zoo
from tests.conftest import ROOT, write_vocab

RANGES = {"A": 0.02, "B": 0.03}  # the config fingerprint (every format keeps initializer_range)
LOADS = 12  # reads per format while the writer runs (at least; until A and B were both seen)
MAX_LOADS = 400


def _original(path, which):
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16, initializer_range=RANGES[which])
    rng = np.random.default_rng(1 if which == "A" else 2)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in expected_shapes(cfg).items()
               if n.startswith("bert.")}
    vocab = write_vocab(os.path.join(os.path.dirname(path), f"vocab-{which}.txt"), 40)
    lines = read_vocab_lines(vocab)
    lines[-1] = f"marker{which}"  # the vocab's fingerprint
    with open(vocab, "w") as f:
        f.write("\n".join(lines) + "\n")
    write_checkpoint(path, list(tensors.items()), cfg, vocab)
    return path


def _digest(tensors: dict) -> dict:
    return {n: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for n, a in tensors.items()}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """{"A"|"B": (bert_of folder, {canonical: sha256 of the original tensor})}."""
    d = tmp_path_factory.mktemp("pair")
    out = {}
    for which in "AB":
        path = _original(str(d / which), which)
        out[which] = (path, _digest(load_safetensors(os.path.join(path, "model.safetensors"))))
    return out


def _which(source, tensors, pair) -> str:
    """"A" or "B": the checkpoint this read is, config, tensors and vocab all agreeing; else fails."""
    which = next((w for w, r in RANGES.items() if r == source.config.initializer_range), None)
    assert which, f"config from neither checkpoint: initializer_range {source.config.initializer_range}"
    want = pair[which][1]
    got = _digest(tensors)
    assert "bert.embeddings.word_embeddings.weight" in got
    mixed = sorted(n for n in got if n in want and got[n] != want[n])
    assert not mixed, f"config of {which} with other tensors: {mixed[:3]}"
    if source.vocab_file:
        assert read_vocab_lines(source.vocab_file)[-1] == f"marker{which}", f"config of {which}, other vocab"
    return which


WRITER = r"""
import os, sys
from bert_of.converters.convert import convert
from bert_of.converters.source import Options
a, b, dst, fmt, stop = sys.argv[1:]
n = 0
while not os.path.exists(stop):
    convert(f"of2{fmt}", a if n % 2 else b, dst, Options(overwrite=True))
    n += 1
    print(n, flush=True)  # one line a swap: the reader waits on them, never on the clock
"""


def _race(tmp_path, pair, fmt, loads, read):
    """The writer process converts A and B into ``dst`` in turn (convert --overwrite) until this one
    has read it ``loads`` times and seen both; returns ({"A": n, "B": n}, swaps)."""
    dst, stop, log = str(tmp_path / "dst"), str(tmp_path / "stop"), str(tmp_path / "writer.log")
    conv.convert(f"of2{fmt}", pair["A"][0], dst)
    env = dict(os.environ, PYTHONPATH=ROOT)
    with open(log, "w") as err:
        w = subprocess.Popen([sys.executable, "-c", WRITER, pair["A"][0], pair["B"][0], dst, fmt, stop],
                             stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT)
    seen = {"A": 0, "B": 0}
    try:
        assert w.stdout.readline(), f"the writer stopped: {open(log).read()[-2000:]}"  # it is swapping
        for i in range(MAX_LOADS):
            if i >= loads and all(seen.values()):
                break
            seen[read(dst)] += 1
            if not all(seen.values()) and i % 10 == 9:  # a starved writer: wait for its next swap
                assert w.stdout.readline(), f"the writer stopped: {open(log).read()[-2000:]}"
    finally:
        open(stop, "w").close()
        out = w.communicate(timeout=120)[0]
    assert w.returncode == 0, open(log).read()[-2000:]
    swaps = int(out.split()[-1]) if out.split() else 1
    assert all(seen.values()), f"the race was not seen: {seen} in {MAX_LOADS} reads, {swaps} swaps"
    return seen, swaps


@pytest.mark.parametrize("fmt,loads", [("hf", LOADS), ("lazy", LOADS), ("tf", LOADS), ("ofsd", LOADS), ("h5", 4)])
def test_every_read_is_one_checkpoint(tmp_path, pair, fmt, loads):
    def read(dst):
        source, tensors = conv.load(dst, fmt)
        which = _which(source, tensors, pair)
        again = source.load()  # a second stream (verify's) reads the same tree
        assert _digest(again) == _digest(tensors)
        return which

    seen, swaps = _race(tmp_path, pair, fmt, loads, read)
    assert swaps >= 1


def test_every_of_load_is_one_checkpoint(tmp_path, pair):
    def read(dst):
        ck = load_checkpoint(dst)  # bert_of's own loader
        which = _which(SimpleNamespace(config=ck.config, vocab_file=None), ck.tensors, pair)
        source, tensors = conv.load(dst, "of")  # and the converter's reader of the format
        _which(source, tensors, pair)
        return which

    _race(tmp_path, pair, "of", LOADS, read)


def test_a_single_file_source_is_read_whole(tmp_path, pair):
    """An .h5 file and a TF prefix named directly: their folder is the tree held."""
    def read_prefix(dst):
        source, tensors = conv.load(os.path.join(dst, "bert_model.ckpt"), "tf")
        return _which(source, tensors, pair)

    _race(tmp_path, pair, "tf", LOADS, read_prefix)


# --------------------------------------------------------------------------- the swap between two steps


class _SwapAfterConfig:
    """The held tree of a reader, which swaps ``dst`` for ``other`` (RENAME_EXCHANGE, the old tree
    kept: the reader's tree is still whole) right after the reader opened its config: between the
    reader's config and its weights."""

    def __init__(self, pin, dst, other):
        self.pin, self.dst, self.other, self.swapped = pin, dst, other, False

    def __getattr__(self, name):
        return getattr(self.pin, name)

    def hold(self, p, spare=False):
        held = self.pin.hold(p, spare)
        if not self.swapped and os.path.basename(p) == "config.json":
            assert _rename2(self.other, self.dst, _RENAME_EXCHANGE)
            self.swapped = True
        return held


def test_a_swap_between_config_and_weights_reads_the_tree_held(tmp_path, pair):
    dst, other = str(tmp_path / "dst"), str(tmp_path / "other")
    conv.convert("of2hf", pair["A"][0], dst)
    conv.convert("of2hf", pair["B"][0], other)
    calls = []

    def read_pinned(pin):
        calls.append(pin)
        return hf._read(_SwapAfterConfig(pin, dst, other), dst, Options())

    source = reader.whole(dst, read_pinned)
    assert len(calls) == 1 and calls[0].replaced()  # dst names B now; the reader's pin held A
    assert _which(source, source.load(), pair) == "A"
    assert conv.load(dst, "hf")[0].config.initializer_range == RANGES["B"]  # the path itself is B now


def test_a_tree_replaced_and_deleted_mid_read_is_read_again(tmp_path, pair):
    """publishing deletes the tree a reader held: the read starts again, on the new tree."""
    dst = str(tmp_path / "dst")
    conv.convert("of2lazy", pair["A"][0], dst)
    b_lazy = str(tmp_path / "b")
    conv.convert("of2lazy", pair["B"][0], b_lazy)
    pins = []

    def read_pinned(pin):
        pins.append(pin)
        if len(pins) == 1:  # after the pin, before any file: dst replaced by B, A's tree deleted
            with publishing(dst, overwrite=True) as stage:
                shutil.copytree(b_lazy, stage, dirs_exist_ok=True)
        return lazy._read(pin, dst, Options())

    source = reader.whole(dst, read_pinned)
    assert len(pins) == 2 and pins[0].fd is None  # the first pin found its tree gone and was let go
    assert _which(source, source.load(), pair) == "B"


# --------------------------------------------------------------------------- resolve, from_pretrained


SWAPS = r"""
import sys
from bert_of.converters.convert import convert
from bert_of.converters.source import Options
a, b, dst, fmt, n = sys.argv[1:]
for i in range(int(n)):
    convert(f"of2{fmt}", b if i % 2 == 0 else a, dst, Options(overwrite=True))
"""


def test_resolve_of_a_folder_replaced_while_converted_converts_again(tmp_path, pair, monkeypatch):
    """A source replaced while the zoo converts it is converted again (bounded), not refused: the
    writer replaces it 4 times, fewer than the attempts, so every resolve succeeds, whole."""
    monkeypatch.setenv("BERT_OF_HOME", str(tmp_path / "home"))
    dst = str(tmp_path / "dst")
    conv.convert("of2hf", pair["A"][0], dst)
    w = subprocess.Popen([sys.executable, "-c", SWAPS, pair["A"][0], pair["B"][0], dst, "hf", str(reader.ATTEMPTS - 1)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    seen = []
    while True:
        done = w.poll() is not None
        out = Zoo().resolve(dst)
        ck = load_checkpoint(out)
        seen.append(_which(SimpleNamespace(config=ck.config, vocab_file=ck.vocab_file), ck.tensors, pair))
        if done:
            break
    assert w.wait() == 0, w.stderr.read()[-2000:]
    assert seen[-1] == "A"  # the writer's last conversion is A's
