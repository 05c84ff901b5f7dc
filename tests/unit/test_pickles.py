"""The one safe pickle reader (bert_of.pickles): data only, nothing run, work bounded by the input."""

import collections
import os
import pickle

import pytest

from bert_of import pickles


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_data_parses_as_pickle_reads_it(protocol):
    value = {"model": {"a.weight": 1, "b": [1.5, -2, None, True, "é"]}, "epoch": 3, "betas": (0.9, 0.999),
             "big": 2 ** 40, "neg": -7, "list": [[], {}, ()]}
    if protocol >= 3:  # protocol 2 pickles bytes through a global (_codecs.encode): refused
        value["bytes"] = b"\x00\x01"
    assert pickles.parse(pickle.dumps(value, protocol=protocol)) == value


def test_globals_are_refused_by_name_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"

    class Runs:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    raw = pickle.dumps({"x": Runs()}, protocol=2)
    with pytest.raises(pickles.Refused, match=r"^global (posix|os)\.system$"):
        pickles.parse(raw)
    admitted = {("collections", "OrderedDict"): "od"}
    made = pickles.parse(pickle.dumps(collections.OrderedDict(a=1), protocol=2), admitted,
                         reduce=lambda fn, args: {"made by": fn, "args": args})
    assert made == {"made by": "od", "args": (), "a": 1}  # the caller decides what REDUCE makes; SETITEMS fill it
    with pytest.raises(pickles.Refused, match="REDUCE of 'od'"):
        pickles.parse(pickle.dumps(collections.OrderedDict(a=1), protocol=2), admitted)
    assert not marker.exists()


def test_shared_references_and_cycles_are_bounded():
    # 40 levels of (x, x): 250 bytes that name 2^40 leaves when walked as a tree
    raw = b"\x80\x02(K\x00q\x00" + b"h\x00h\x00\x86q\x00" * 40 + b"t."
    obj = pickles.parse(raw)
    with pytest.raises(pickles.Refused, match="expands to more than"):
        pickles.plain(obj, 4 * len(raw))
    cyclic = b"\x80\x02]q\x00h\x00a."  # a list appended to itself
    with pytest.raises(pickles.Refused, match="holds itself"):
        pickles.plain(pickles.parse(cyclic), 100)
    with pytest.raises(pickles.Refused, match="too deeply nested"):
        pickles.parse(b"\x80\x02" + b"(" * 100)
    with pytest.raises(pickles.Refused, match="an integer of 200 bytes"):
        pickles.parse(b"\x80\x02\x8a\xc8" + b"\x01" * 200 + b".")
    with pytest.raises(pickles.Refused, match="truncated stream"):
        pickles.parse(pickle.dumps({"a": "b" * 100}, protocol=2)[:20])
    with pytest.raises(pickles.Refused, match=r"pickle opcode b'I'"):
        pickles.parse(b"\x80\x02I1\n.")
