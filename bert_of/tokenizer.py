"""A tokenizer with transformers' call convention, on bert_of's WordPiece.

    tok = BertTokenizer.from_pretrained("bert-base")      # a zoo name, or a checkpoint folder in any format
    batch = tok(["A man is eating.", "Hello"], padding=True, truncation=True, max_length=128,
                return_tensors="np")
    batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]   # int64 [batch, seq]
    model(**batch)                                         # BertModel takes them as they are

The keys, padding and truncation rules are those of transformers' ``BertTokenizerFast`` (checked id
for id on real text: bench/tokenizer_parity.py); the tokens are bert_of's WordPiece
(:mod:`bert_of.tokenization`: Google's rules, the fast path for whole lines). ``do_lower_case``
comes from the checkpoint: what its folder records (``tokenizer_config.json``, a fine-tuned run's
``train_args.json``, a ``do_lower_case`` config key), else what its vocabulary says.

Words longer than 100 characters are ``[UNK]`` here, as in transformers (Google's scripts: 200).
"""

from __future__ import annotations

import os
import shutil
from typing import List, Optional, Sequence, Union

import numpy as np

from bert_of.checkpoint import resolve_checkpoint, run_final
from bert_of.errors import BertOfError, InputError
from bert_of.files.atomic import write_json
from bert_of.files.publish import publishing_into
from bert_of.files.reading import read_json
from bert_of.tokenization import FastTokenizer, FullTokenizer
from bert_of.vocab import TOKENIZER_JSON, lower_case_for, read_vocab_lines, vocab_from_tokenizer_json

TextInput = Union[str, Sequence[str]]

# transformers' tokenizer files
VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "mask_token": "[MASK]"}


class BatchEncoding(dict):
    """What a tokenizer call returns: a dict of ``input_ids``, ``token_type_ids``,
    ``attention_mask`` (and, when asked, ``offset_mapping``, ``special_tokens_mask``, ``length``),
    readable as attributes too. ``word_ids(i)`` maps each token of row ``i`` to the index of the
    word it came from (``is_split_into_words=True``) or of its basic-token word (None for special
    tokens and padding)."""

    def __init__(self, data: dict, word_ids: list):
        super().__init__(data)
        self._word_ids = word_ids

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def word_ids(self, batch_index: int = 0) -> list:
        return list(self._word_ids[batch_index])


class BertTokenizer:
    """WordPiece with ``[CLS] a [SEP] (b [SEP])`` inputs, called as transformers' tokenizers are.

    >>> tok = BertTokenizer("vocab.txt", do_lower_case=True)
    >>> tok("Hello world!")["input_ids"]               # [101, 7592, 2088, 999, 102]
    >>> tok.decode(tok.encode("Hello world!"), skip_special_tokens=True)   # 'hello world!'
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = True, model_max_length: int = 512,
                 max_input_chars_per_word: int = 100, padding_side: str = "right", truncation_side: str = "right"):
        self.vocab_file = vocab_file
        self.do_lower_case = bool(do_lower_case)
        self.model_max_length = int(model_max_length)
        self.padding_side = padding_side  # "right" or "left": where padding goes (and, truncating, what is cut)
        self.truncation_side = truncation_side
        self._ref = FullTokenizer(vocab_file, do_lower_case=self.do_lower_case,
                                  max_input_chars_per_word=max_input_chars_per_word)
        self._fast = FastTokenizer(self._ref)
        self.vocab = self._ref.vocab
        self.ids_to_tokens = self._ref.inv_vocab
        for name in ("unk", "sep", "pad", "cls", "mask"):
            token = f"[{name.upper()}]"
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", self.vocab.get(token))
        missing = [t for t in ("[CLS]", "[SEP]", "[PAD]", "[UNK]") if t not in self.vocab]
        if missing:
            raise BertOfError(f"{vocab_file}: not a BERT vocabulary (no {', '.join(missing)})")
        self.all_special_tokens = [t for t in ("[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]") if t in self.vocab]
        self.all_special_ids = [self.vocab[t] for t in self.all_special_tokens]
        self._offsets = False  # whether this call tracks character offsets (the slower path)

    # ---------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, name_or_path: str, do_lower_case: Optional[bool] = None,
                        model_max_length: Optional[int] = None, **kwargs) -> "BertTokenizer":
        """The tokenizer of a checkpoint, read from its tokenizer files only: ``vocab.txt``, else a
        BERT ``tokenizer.json`` (transformers' BertTokenizerFast's, see
        :func:`bert_of.vocab.read_tokenizer_json`), in the folder given, the folder of a file or TF
        prefix given, or a training run's final checkpoint; no weight is read. A zoo name goes
        through the resolver (downloaded once, as ``from_pretrained`` of a model).
        ``do_lower_case`` None: what the checkpoint records (tokenizer_config.json, then
        tokenizer.json's normalizer), else its vocabulary's case."""
        path = os.fspath(name_or_path)
        folder = _tokenizer_folder(path)
        if folder is None:
            folder = resolve_checkpoint(path)
        vocab = os.path.join(folder, VOCAB_FILE)
        if not os.path.isfile(vocab):
            if not os.path.isfile(os.path.join(folder, TOKENIZER_JSON)):
                raise BertOfError(f"{name_or_path}: no vocab.txt or tokenizer.json (a tokenizer needs the "
                                  f"checkpoint's vocabulary)")
            vocab, spec = vocab_from_tokenizer_json(os.path.join(folder, TOKENIZER_JSON))
            kwargs.setdefault("max_input_chars_per_word", spec.max_input_chars_per_word)
        do_lower_case, _ = lower_case_for(folder, vocab, do_lower_case)  # the rule finetune/predict follow
        recorded = _recorded_settings(folder)
        if model_max_length is None:
            model_max_length = recorded.pop("model_max_length", None) or _max_positions(folder)
        recorded.pop("model_max_length", None)
        return cls(vocab, do_lower_case=do_lower_case, model_max_length=model_max_length, **{**recorded, **kwargs})

    # ---------------------------------------------------------------- text <-> tokens <-> ids
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str) -> List[str]:
        return self._fast.tokenize(text)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._ref.convert_tokens_to_ids([tokens])[0]
        return self._ref.convert_tokens_to_ids(tokens)

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, (int, np.integer)):
            return self.ids_to_tokens[self._check_id(ids)]
        skip = set(self.all_special_ids) if skip_special_tokens else ()
        return [self.ids_to_tokens[self._check_id(i)] for i in ids if int(i) not in skip]

    def _check_id(self, i) -> int:
        i = int(i)
        if i not in self.ids_to_tokens:
            raise InputError(f"token id {i} is outside the vocabulary (0..{len(self.vocab) - 1})")
        return i

    def convert_tokens_to_string(self, tokens: List[str]) -> str:
        return " ".join(tokens).replace(" ##", "").strip()

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = True) -> str:
        """Token ids back to text: WordPieces joined (``##`` pieces glued on), and, as transformers
        does, the space before ``. ? ! ,`` and English contractions removed."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        text = self.convert_tokens_to_string(self.convert_ids_to_tokens(ids, skip_special_tokens))
        if clean_up_tokenization_spaces:
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text

    def encode(self, text, text_pair=None, add_special_tokens: bool = True, **kwargs) -> List[int]:
        """The ``input_ids`` of one text (or pair) as a list."""
        return self(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)["input_ids"]

    def batch_decode(self, sequences, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool = True) -> List[str]:
        """:meth:`decode` of each row (a list of id lists, or a 2-D array or tensor)."""
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces) for ids in sequences]

    def encode_plus(self, text, text_pair=None, **kwargs) -> BatchEncoding:
        """One text (or pair) encoded as the call encodes it (transformers' older spelling)."""
        if _is_batch(text, kwargs.get("is_split_into_words", False)):
            raise InputError("encode_plus takes one text (or pair); a batch goes to batch_encode_plus or the call")
        return self(text, text_pair, **kwargs)

    def batch_encode_plus(self, batch_text_or_text_pairs, **kwargs) -> BatchEncoding:
        """A batch of texts, or of (text, pair) tuples, encoded as the call encodes it."""
        if not isinstance(batch_text_or_text_pairs, (list, tuple)):
            raise InputError(f"batch_encode_plus takes a list of texts or (text, pair) tuples, got "
                             f"{type(batch_text_or_text_pairs).__name__}")
        return self(list(batch_text_or_text_pairs), **kwargs)

    def save_pretrained(self, save_directory: str) -> tuple:
        """Write vocab.txt, tokenizer_config.json and special_tokens_map.json into the folder
        ``save_directory`` (new or existing; other files kept) as transformers' BertTokenizer saves
        them, so transformers' ``AutoTokenizer`` and this class read the same tokenizer back
        (lower-casing, maximum length, padding and truncation sides). Returns the paths written."""
        files = hf_tokenizer_files(self.vocab_file, self.do_lower_case, self.model_max_length,
                                   padding_side=self.padding_side, truncation_side=self.truncation_side)
        with publishing_into(save_directory) as stage:
            shutil.copyfile(self.vocab_file, os.path.join(stage, VOCAB_FILE))
            for name, obj in files.items():
                write_json(os.path.join(stage, name), obj)
        return tuple(os.path.join(save_directory, n) for n in (TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE, VOCAB_FILE))

    # ---------------------------------------------------------------- the call
    def __call__(self, text: TextInput, text_pair: Optional[TextInput] = None, *, add_special_tokens: bool = True,
                 padding: Union[bool, str] = False, truncation: Union[bool, str, None] = None,
                 max_length: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                 is_split_into_words: bool = False, return_tensors: Optional[str] = None,
                 return_token_type_ids: Optional[bool] = None, return_attention_mask: Optional[bool] = None,
                 return_offsets_mapping: bool = False, return_special_tokens_mask: bool = False,
                 return_length: bool = False, padding_side: Optional[str] = None) -> BatchEncoding:
        """Encode a text, a pair, or a batch of either.

        ``padding``: False; True / "longest" (to the longest row); "max_length" (to ``max_length``,
        else the model's). ``truncation``: True / "longest_first" (the longer of a pair loses tokens
        first), "only_first", "only_second", False; None: "longest_first" when ``max_length`` is
        given without padding, as transformers does. ``pad_to_multiple_of``: padded widths rounded up
        to a multiple (truncating too, ``max_length`` must be one: a ValueError otherwise, as
        transformers). ``padding_side`` ("right", "left"; default the tokenizer's) where the padding
        goes; the tokenizer's ``truncation_side`` which end truncation cuts. A batch of (text, pair)
        tuples is a batch of pairs. ``return_tensors``: None (lists; one text gives flat lists), "np"
        (int64 arrays [batch, seq]) or "of" (OneFlow tensors).
        """
        batched = _is_batch(text, is_split_into_words)
        texts = list(text) if batched else [text]
        if text_pair is None and batched and texts and all(isinstance(t, tuple) and len(t) == 2 for t in texts) \
                and not is_split_into_words:
            texts, text_pair = [a for a, _ in texts], [b for _, b in texts]
        if text_pair is None:
            pairs = [None] * len(texts)
        else:
            pairs = list(text_pair) if batched else [text_pair]
            if len(pairs) != len(texts):
                raise InputError(f"{len(texts)} texts but {len(pairs)} text pairs")
        if not texts:
            raise InputError("an empty batch: no text to encode")
        side = self.padding_side if padding_side is None else padding_side
        for name, value in (("padding_side", side), ("truncation_side", self.truncation_side)):
            if value not in ("right", "left"):
                raise InputError(f"{name}={value!r}: expected 'right' or 'left'")
        pad_mode, trunc_mode, max_length = self._strategies(padding, truncation, max_length, pairs[0] is not None)
        if pad_to_multiple_of is not None and (isinstance(pad_to_multiple_of, bool) or
                                               not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
            raise InputError(f"pad_to_multiple_of={pad_to_multiple_of!r}: expected a positive integer")
        if trunc_mode and pad_mode and pad_to_multiple_of and max_length % pad_to_multiple_of:
            raise InputError(f"truncation and padding are both on, but the truncation length ({max_length}) is not a "
                             f"multiple of pad_to_multiple_of ({pad_to_multiple_of})")
        self._offsets = return_offsets_mapping
        rows = [self._encode_one(a, b, add_special_tokens, trunc_mode, max_length, is_split_into_words)
                for a, b in zip(texts, pairs)]
        if pad_mode == "longest":
            width = max(len(r["input_ids"]) for r in rows)
        elif pad_mode == "max_length":
            width = max_length
        else:
            width = None
        if width is not None and pad_to_multiple_of:
            width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
        out = {k: [] for k in ("input_ids", "token_type_ids", "attention_mask", "offset_mapping",
                               "special_tokens_mask", "length")}
        words = []
        for r in rows:
            n = len(r["input_ids"])
            pad = max(0, width - n) if width is not None else 0

            def padded(row, fill):
                return [fill] * pad + row if side == "left" else row + [fill] * pad

            out["length"].append(n)
            out["input_ids"].append(padded(r["input_ids"], self.pad_token_id))
            out["token_type_ids"].append(padded(r["token_type_ids"], 0))
            out["attention_mask"].append(padded([1] * n, 0))
            out["offset_mapping"].append(padded(r["offsets"], (0, 0)))
            out["special_tokens_mask"].append(padded(r["special"], 1))
            words.append(padded(r["words"], None))
        keep = {"input_ids": True, "token_type_ids": return_token_type_ids is not False,
                "attention_mask": return_attention_mask is not False, "offset_mapping": return_offsets_mapping,
                "special_tokens_mask": return_special_tokens_mask, "length": return_length}
        data = {k: v for k, v in out.items() if keep[k]}
        if return_tensors is not None:
            data = {k: _as_tensor(k, v, return_tensors) for k, v in data.items()}
        elif not batched:
            data = {k: v[0] for k, v in data.items()}
        return BatchEncoding(data, words)

    def _strategies(self, padding, truncation, max_length, pair: bool):
        pad = {False: None, "do_not_pad": None, True: "longest", "longest": "longest",
               "max_length": "max_length"}.get(padding, "?")
        if pad == "?":
            raise InputError(f"padding={padding!r}: expected True, False, 'longest', 'max_length' or 'do_not_pad'")
        if truncation is None:
            truncation = "longest_first" if max_length is not None and pad is None else False
        trunc = {False: None, "do_not_truncate": None, True: "longest_first", "longest_first": "longest_first",
                 "only_first": "only_first", "only_second": "only_second"}.get(truncation, "?")
        if trunc == "?":
            raise InputError(f"truncation={truncation!r}: expected True, False, 'longest_first', 'only_first', "
                              "'only_second' or 'do_not_truncate'")
        if trunc == "only_second" and not pair:
            raise InputError("truncation='only_second' needs a text pair")
        if max_length is None and (trunc or pad == "max_length"):
            max_length = self.model_max_length
        return pad, trunc, max_length

    def _encode_one(self, a, b, special: bool, trunc, max_length, split_words: bool) -> dict:
        ta = self._pieces(a, split_words)
        tb = self._pieces(b, split_words) if b is not None else None
        if trunc:
            room = max_length - ((3 if tb is not None else 2) if special else 0)
            ta, tb = _truncate(ta, tb, room, trunc, self.truncation_side == "left")
        cls_, sep = (self.cls_token_id, self.sep_token_id)
        ids, types, offs, spec, words = [], [], [], [], []

        def add(pieces, segment):
            for tok_id, off, word in pieces:
                ids.append(tok_id)
                types.append(segment)
                offs.append(off)
                spec.append(0)
                words.append(word)

        def mark(tok_id, segment):
            ids.append(tok_id)
            types.append(segment)
            offs.append((0, 0))
            spec.append(1)
            words.append(None)

        if special:
            mark(cls_, 0)
        add(ta, 0)
        if special:
            mark(sep, 0)
        if tb is not None:
            add(tb, 1)
            if special:
                mark(sep, 1)
        return {"input_ids": ids, "token_type_ids": types, "offsets": offs, "special": spec, "words": words}

    def _pieces(self, text, split_words: bool) -> list:
        """[(id, (start, end), word index)] of one text (or one pre-split list of words)."""
        if split_words:
            out = []
            for w, word in enumerate(text):
                out += [(i, off, w) for i, off, _ in self._pieces_of(word)]
            return out
        return self._pieces_of(text)

    def _pieces_of(self, text: str) -> list:
        if not isinstance(text, str):
            raise InputError(f"expected text (str), got {type(text).__name__}")
        out, word = [], 0
        for part, is_special, start in _split_special(self._ref, text):
            if is_special:
                out.append((self.vocab[part], (start, start + len(part)), word))
                word += 1
                continue
            if not self._offsets:  # the fast path: C string operations, WordPiece cached per word
                for w in self._fast.words(part):
                    out += [(i, (0, 0), word) for i in self._fast.ids(w)]
                    word += 1
                continue
            for chars, origins in self._ref.basic.words_with_offsets(part):
                pieces = self._ref.wordpiece.tokenize(chars)
                if pieces == [self._ref.unk_token]:
                    spans = [(origins[0], origins[-1] + 1)]
                else:
                    spans, k = [], 0
                    for p in pieces:
                        n = len(p) - 2 if p.startswith("##") else len(p)
                        spans.append((origins[k], origins[k + n - 1] + 1))
                        k += n
                for p, (s, e) in zip(pieces, spans):
                    out.append((self.vocab.get(p, self.unk_token_id), (start + s, start + e), word))
                word += 1
        return out


def hf_tokenizer_files(vocab_file: str, do_lower_case: bool, model_max_length: int, padding_side: str = "right",
                       truncation_side: str = "right") -> dict:
    """{file name: JSON object} of tokenizer_config.json and special_tokens_map.json as transformers'
    BertTokenizer saves them beside vocab.txt: AutoTokenizer then lower-cases exactly when this
    tokenizer does (its default would lower-case a cased model's text). One definition for
    ``BertTokenizer.save_pretrained`` and the HF writer (converters/formats/hf/)."""
    vocab = set(read_vocab_lines(vocab_file))
    specials = {k: t for k, t in SPECIAL_TOKENS.items() if t in vocab}
    cfg = {"tokenizer_class": "BertTokenizer", "do_lower_case": bool(do_lower_case), "do_basic_tokenize": True,
           "never_split": None, "tokenize_chinese_chars": True, "strip_accents": None,
           "model_max_length": int(model_max_length), "clean_up_tokenization_spaces": True, **specials}
    for key, side in (("padding_side", padding_side), ("truncation_side", truncation_side)):
        if side != "right":  # transformers' default
            cfg[key] = side
    return {TOKENIZER_CONFIG_FILE: cfg, SPECIAL_TOKENS_FILE: specials}


# --------------------------------------------------------------------------- helpers


def _is_batch(text, split_words: bool) -> bool:
    if isinstance(text, str):
        return False
    if not isinstance(text, (list, tuple)):
        raise InputError(f"expected a str or a list of them, got {type(text).__name__}")
    if split_words:  # a list of words is one text; a list of such lists, a batch
        return bool(text) and not isinstance(text[0], str)
    return True


def _split_special(ref: FullTokenizer, text: str):
    """[(piece, is_special, start offset)] (literal special tokens kept whole, as the tokenizer does)."""
    out, pos = [], 0
    for piece, special in ref._split_special(text):
        out.append((piece, special, pos))
        pos += len(piece)
    return out


def _truncate(a: list, b: Optional[list], room: int, mode: str, left: bool = False) -> tuple:
    """Cut a and b (lists of pieces) to ``room`` tokens together, as transformers' fast tokenizers
    do: "longest_first" keeps the shorter whole when it fits in half the room, else gives each half
    (the longer, or the pair's second on a tie, the odd one); "only_first"/"only_second" cut one.
    ``left``: each keeps its last tokens (truncation_side "left")."""
    a, b = (a[::-1], None if b is None else b[::-1]) if left else (a, b)
    a, b = _truncate_right(a, b, room, mode)
    return (a[::-1], None if b is None else b[::-1]) if left else (a, b)


def _truncate_right(a: list, b: Optional[list], room: int, mode: str) -> tuple:
    if room < 0:
        raise InputError(f"max_length leaves no room for the special tokens ({-room} too few)")
    n1, n2 = len(a), len(b) if b is not None else 0
    if n1 + n2 <= room:
        return a, b
    if b is None:
        if mode == "only_second":
            raise InputError("truncation='only_second' needs a text pair")
        return a[:room], b
    if mode == "only_first":
        if n2 > room:
            raise InputError(f"the second text alone ({n2} tokens) is longer than max_length allows ({room})")
        return a[:room - n2], b
    if mode == "only_second":
        if n1 > room:
            raise InputError(f"the first text alone ({n1} tokens) is longer than max_length allows ({room})")
        return a, b[:room - n1]
    short, long_ = sorted((n1, n2))
    keep_short = short
    keep_long = max(short, room - short) if short <= room else short
    if keep_short + keep_long > room:
        keep_short = room // 2
        keep_long = keep_short + room % 2
    k1, k2 = (keep_short, keep_long) if n1 <= n2 else (keep_long, keep_short)
    return a[:k1], b[:k2]


def _as_tensor(key: str, rows: list, kind: str):
    if len({len(r) for r in rows}) > 1:
        raise InputError(f"rows of different lengths cannot make one tensor ({key}): use padding=True")
    arr = np.asarray(rows, dtype=np.int64)
    if kind == "np":
        return arr
    if kind == "of":
        from bert_of._flow import flow  # OneFlow loads only when its tensors are asked for

        return flow.tensor(arr, dtype=flow.int64)
    raise InputError(f"return_tensors={kind!r}: bert_of returns 'np' (NumPy) or 'of' (OneFlow) tensors")


def _tokenizer_folder(path: str) -> Optional[str]:
    """The folder whose tokenizer files serve ``path``: ``path`` (a training run's: its final
    checkpoint), the folder of a file or TF prefix; None for what is not on disk (a zoo name).
    A folder without tokenizer files is still the answer: its error says so, no weight is read."""
    if os.path.isdir(path):
        folder = run_final(path)
        return folder if os.path.isdir(folder) else path
    if os.path.isfile(path) or os.path.exists(path + ".index"):
        return os.path.dirname(os.path.abspath(path))
    return None


def _recorded_settings(folder: str) -> dict:
    """padding_side, truncation_side and model_max_length a folder's tokenizer_config.json records
    (transformers'; its "no limit", 10^30, is not one)."""
    path = os.path.join(folder, TOKENIZER_CONFIG_FILE)
    if not os.path.isfile(path):
        return {}
    cfg = read_json(path, TOKENIZER_CONFIG_FILE)
    out = {k: cfg[k] for k in ("padding_side", "truncation_side") if cfg.get(k) in ("right", "left")}
    n = cfg.get("model_max_length")
    if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1 << 24:
        out["model_max_length"] = n
    return out


def _max_positions(folder: str) -> int:
    for name in ("config.json", "bert_config.json"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            n = read_json(path, name).get("max_position_embeddings")
            if isinstance(n, int) and n > 0:
                return n
    return 512


__all__ = ["BertTokenizer", "BatchEncoding"]
