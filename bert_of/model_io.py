"""Loading and saving a model: from_pretrained / save_pretrained over a bert_of checkpoint
directory, the canonical state in and out, Google's init."""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

import bert_of.resolver as _resolver
from bert_of._flow import flow
from bert_of.checkpoint import StreamedTensors, load_checkpoint, resolve_checkpoint, write_checkpoint
from bert_of.config import BertConfig, check_override_names
from bert_of.errors import CheckpointError, ConfigError, MissingVocab
from bert_of.files.publish import publishing_into
from bert_of.initializers import truncated_normal
from bert_of.progress import log
from bert_of.tensors import check_fit, check_role
from bert_of.vocab import check_vocab_fits

nn = flow.nn


class PreTrained(nn.Module):
    """from_pretrained / save_pretrained over a bert_of checkpoint directory."""

    # Prefix this class's own names carry inside a full (canonical) checkpoint.
    _ckpt_prefix = ""

    def state_name(self, key: str) -> str:
        """The state-dict key ``key`` as the canonical names spell it, without this class's prefix
        (optimizer state is stored under it): the key itself, unless the model class places a
        module otherwise than the canonical names say (pre-LN's LayerNorms, bert_of.modeling)."""
        return key

    def canonical_name(self, key: str) -> str:
        """The canonical name of the state-dict key ``key``."""
        return self._ckpt_prefix + self.state_name(key)

    def canonical_state(self) -> dict:
        """{canonical name: numpy array}; tied decoder weight appears once."""
        return {self.canonical_name(k): v.numpy() for k, v in local_state(self).items()}

    # ---------------------------------------------------------------- transformers' embedding API
    def get_input_embeddings(self):
        """The word embedding table, an ``nn.Embedding`` [V, H] (the MLM head's decoder is it, tied)."""
        return self.base_model.embeddings.word_embeddings

    def set_input_embeddings(self, value) -> None:
        """Use ``value`` (an ``nn.Embedding`` [V', H]) as the word table. ``config.vocab_size``
        follows its rows, so the input gate checks ids against the table in use; a model with an
        MLM head keeps a bias per word: change its size with :meth:`resize_token_embeddings`."""
        H = self.config.hidden_size
        if not isinstance(value, nn.Embedding) or value.embedding_dim != H:
            raise ConfigError(f"set_input_embeddings: expected an nn.Embedding of width {H} (hidden_size), got "
                              f"{type(value).__name__}{list(value.weight.shape) if hasattr(value, 'weight') else ''}")
        n = value.num_embeddings
        for m in self.modules():
            resize = getattr(m, "resize_vocab", None)
            if resize is not None and tuple(m.bias.shape) != (n,):
                raise ConfigError(f"set_input_embeddings: a table of {n} words under an MLM head of "
                                  f"{m.bias.shape[0]}: use resize_token_embeddings({n})")
        self.base_model.embeddings.word_embeddings = value
        self._set_vocab_size(n)

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True, seed: int = 0):
        """transformers' resize: a word table of ``new_num_tokens`` rows (rounded up to a multiple
        of ``pad_to_multiple_of``), its first rows kept, ``config.vocab_size`` and the MLM head's
        bias following. New rows: with ``mean_resizing``, the old rows' mean (transformers draws
        them from N(mean, 1e-9 cov), within ~3e-5 of their spread of it) and the bias' mean; else
        N(0, initializer_range) drawn with NumPy from ``seed`` and bias 0. Returns the table;
        None and None: the table as it is."""
        table = self.get_input_embeddings()
        if new_num_tokens is None and pad_to_multiple_of is None:
            return table
        n = table.num_embeddings if new_num_tokens is None else new_num_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"resize_token_embeddings: new_num_tokens {n!r} is not a positive integer")
        if pad_to_multiple_of is not None:
            if isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
                raise ConfigError(f"resize_token_embeddings: pad_to_multiple_of {pad_to_multiple_of!r} is not a "
                                  f"positive integer")
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        old = to_local_full(table.weight.detach()).numpy()
        rows = old[:n]
        if n > old.shape[0]:
            extra = n - old.shape[0]
            if mean_resizing:
                fresh = np.broadcast_to(old.mean(axis=0, dtype=np.float64), (extra, old.shape[1]))
            else:
                fresh = np.random.default_rng(seed).normal(0.0, self.config.initializer_range, (extra, old.shape[1]))
            rows = np.concatenate([old, fresh.astype(old.dtype)])
        new = nn.Embedding(n, old.shape[1])
        new.weight = nn.Parameter(placed_like(rows, table.weight), requires_grad=table.weight.requires_grad)
        for m in self.modules():
            if getattr(m, "resize_vocab", None) is not None:
                m.resize_vocab(n, mean_resizing)
        self.base_model.embeddings.word_embeddings = new
        self._set_vocab_size(n)
        return new

    def _set_vocab_size(self, n: int) -> None:
        """``config.vocab_size`` = n in this model and every module under it holding the config."""
        config = self.config.updated(f"{type(self).__name__}", vocab_size=n)
        for m in self.modules():
            if getattr(m, "config", None) is not None:
                m.config = config

    def load_canonical(self, state: dict, strict_heads: bool = False, ignore_mismatched_sizes: bool = False) -> dict:
        """Copy {canonical name: array} into the parameters.

        Every tensor first passes the gate the converters use (bert_of.tensors): floating
        point, a place in a BERT of this model's config (no layer beyond ``num_hidden_layers``,
        no unknown name) with the shape it implies, the backbone complete. So a config that does
        not fit its tensors is an error here exactly as in ``bert-of convert``. Tensors of task
        heads this class does not have are accepted (and returned as "unexpected"); task heads
        missing from ``state`` keep their fresh init (as when fine-tuning from a pretraining
        checkpoint) unless ``strict_heads``. A head tensor of another shape than the model's (a
        2-label classifier under ``num_labels=3``) is an error naming ``ignore_mismatched_sizes``;
        with it, transformers' behaviour: the head keeps its fresh init and is listed under
        "mismatched" as (name, checkpoint shape, model shape). Returns ``{"missing": [...],
        "unexpected": [...], "mismatched": [...]}``.
        """
        own = {self.canonical_name(k): p for k, p in self.state_dict().items()}
        streamed = isinstance(state, StreamedTensors)  # read each tensor as it is copied in
        arrays = {k: state.spec(k) for k in state} if streamed else {k: np.asarray(v) for k, v in state.items()}
        for name, arr in arrays.items():
            check_role(name, arr.dtype, "checkpoint")
        missing = [k for k in own if k not in arrays]
        unexpected = sorted(k for k in arrays if k not in own)
        bad_missing = [k for k in missing if strict_heads or k.startswith("bert.")]
        if bad_missing:
            raise CheckpointError(f"checkpoint lacks {len(bad_missing)} tensor(s) the model needs, first: {bad_missing[0]}")
        mismatched = []
        for name, param in own.items():
            if name in arrays and tuple(arrays[name].shape) != tuple(param.shape):
                ckpt, want = list(arrays[name].shape), list(param.shape)
                if not ignore_mismatched_sizes or name.startswith("bert."):  # the backbone is the config's
                    hint = "" if name.startswith("bert.") else \
                        " (ignore_mismatched_sizes=True initializes it anew, as transformers)"
                    raise CheckpointError(f"tensor {name}: checkpoint shape {ckpt} != model shape {want}{hint}")
                mismatched.append((name, tuple(ckpt), tuple(want)))
        if mismatched:
            arrays = {k: a for k, a in arrays.items() if k not in {m[0] for m in mismatched}}
            missing += [m[0] for m in mismatched]
        # The rest must fit this config too; a head this class lacks may come from a config with
        # another label count, so its shape is not ours to check.
        check_fit({k: a.shape for k, a in arrays.items()}, self.config, "checkpoint", require_backbone=False,
                  loose=[k for k in unexpected if k.startswith("classifier.")])
        with flow.no_grad():
            for name, param in own.items():
                if name not in arrays:
                    continue
                if not streamed:
                    copy_in(param, arrays[name])
                elif (own_memory := local_cpu_memory(param, arrays[name].dtype)) is not None:
                    state.read_into(name, own_memory)  # straight into the parameter: no second copy
                else:
                    copy_in(param, state[name])
        return {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}

    @classmethod
    def from_pretrained(cls, name_or_path, config: Optional[BertConfig] = None, strict_heads: bool = False, *,
                        vocab: Optional[str] = None, ignore_mismatched_sizes: bool = False, **overrides):
        """Load a model the way HF's ``from_pretrained`` does, from

        - a zoo name or alias ("bert-base": downloaded, verified and converted on first use),
        - a bert_of checkpoint directory (config.json, model.safetensors, vocab.txt),
        - a checkpoint in any format bert_of reads (a Google TF folder or prefix, an HF or Keras
          directory, a lazy OneFlow snapshot: converted once into the cache and reused).

        ``config`` replaces the checkpoint's config. ``overrides`` are BertConfig fields
        (``num_labels=3``, ``hidden_dropout_prob=0.0``, ``output_hidden_states=True``; transformers'
        ``label2id`` too), validated again; any other keyword is a TypeError naming it. Heads
        missing from the checkpoint are newly initialised (see ``load_canonical``);
        ``loading_info`` says which. ``ignore_mismatched_sizes``: a head of another shape (a
        2-label classifier read with ``num_labels=3``) is initialised anew too, with a note.
        ``vocab``: the vocab.txt for a checkpoint without one (an HF folder with model files only,
        as ``--vocab`` on the command line); it must define the model's vocab_size ids.
        """
        who = f"{cls.__name__}.from_pretrained()"
        check_override_names(who, overrides)  # before any loading
        if vocab is not None:
            vocab = os.fspath(vocab)
            if not os.path.isfile(vocab):
                raise CheckpointError(f"{who}: vocab={vocab!r}: no such file")
        try:
            path = resolve_checkpoint(name_or_path, vocab=vocab)
        except MissingVocab as e:
            raise e.spelled("pass vocab='path/to/vocab.txt'") from None
        ckpt = load_checkpoint(path, streamed=True)
        try:
            config = (config or ckpt.config).updated(who, **overrides)  # a new, re-validated config
            model = cls(config)
            info = model.load_canonical(ckpt.tensors, strict_heads=strict_heads,
                                        ignore_mismatched_sizes=ignore_mismatched_sizes)
        finally:
            ckpt.tensors.close()
        fresh = [n for n in info["missing"] if n not in {m[0] for m in info["mismatched"]}]
        if fresh:
            log.info(f"{path}: newly initialised (not in checkpoint): {', '.join(fresh)}")
        for name, ckpt_shape, shape in info["mismatched"]:
            log.warning(f"note: {name} newly initialised: the checkpoint's is {list(ckpt_shape)}, the model's "
                        f"{list(shape)} (ignore_mismatched_sizes=True)")
        model.loading_info = info
        if vocab is not None:
            check_vocab_fits(vocab, config.vocab_size)
        model.vocab_file = vocab if vocab is not None else ckpt.vocab_file  # the one given wins
        model.eval()
        return model

    def save_pretrained(self, path: str, vocab_file: Optional[str] = None, metadata: Optional[dict] = None,
                        format: str = "of") -> None:
        """Write config.json, model.safetensors (+ vocab.txt) into the folder ``path``, new or
        existing, as transformers does: its files of these names are replaced, others kept.
        Every file is written whole before any lands (see :func:`bert_of.files.publish.publishing_into`).

        ``format``: "of", bert_of's layout (read back by ``from_pretrained``); "hf", transformers'
        (its config.json, model.safetensors, vocab.txt and tokenizer files: what ``bert-of convert
        of2hf`` writes, by the same writer), or any other format ``bert-of convert`` writes."""
        vocab_file = vocab_file or getattr(self, "vocab_file", None)
        state = self.canonical_state()
        if format in ("of", "bert_of"):
            write_checkpoint(path, list(state.items()), self.config, vocab_file=vocab_file, metadata=metadata,
                             into=True)
            return
        if _resolver.writer is None:
            raise CheckpointError(f"save_pretrained(format={format!r}): the format writers register with import bert_of")
        with publishing_into(path) as stage:
            for note in _resolver.writer(format, self.config, state, vocab_file, stage):
                log.info(note)

    @property
    def device(self):
        """Where the parameters are (transformers' ``model.device``): a ``flow.device``, or the
        placement of a global model."""
        p = next(self.parameters())
        return p.placement if p.is_global else p.device

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """The parameter count as transformers counts it: each (tied) parameter once;
        ``only_trainable``: those that require grad; ``exclude_embeddings``: without the
        embedding tables (word, position, token type)."""
        tables = {f"{name}.weight" for name, m in self.named_modules() if isinstance(m, nn.Embedding)}
        return sum(p.numel() for name, p in self.named_parameters()
                   if (p.requires_grad or not only_trainable) and not (exclude_embeddings and name in tables))

    def init_weights(self, seed: int = 0, names=None) -> None:
        """Google's init: truncated normal (2 std) weights, zero biases, LayerNorm 1/0.

        Drawn with NumPy in name order so every rank, mode and run starts from
        the same numbers. ``names`` (canonical names, e.g. ``loading_info["missing"]``: heads a
        checkpoint lacked): only those tensors, drawn in the same order; the rest are kept.
        """
        rng = np.random.default_rng(seed)
        std = self.config.initializer_range
        state = {}  # state-dict key -> value
        for key, p in self.state_dict().items():
            name = self.canonical_name(key)
            if names is not None and name not in names:
                continue
            shape = tuple(p.shape)
            if ".LayerNorm." in "." + name and name.endswith("weight"):
                state[key] = np.ones(shape, np.float32)
            elif name.endswith("bias") or ".LayerNorm." in "." + name:
                state[key] = np.zeros(shape, np.float32)
            else:
                state[key] = truncated_normal(rng, shape, std)
        if names is None:
            self.load_canonical({self.canonical_name(k): v for k, v in state.items()}, strict_heads=True)
            return
        own = self.state_dict()
        with flow.no_grad():
            for key, value in state.items():
                copy_in(own[key], value)


def placed_like(arr, like):
    """A numpy array as a tensor of ``like``'s dtype where ``like`` is (its device, or its
    placement and sbp when global)."""
    arr = np.ascontiguousarray(arr)
    if like.is_global:
        return flow.tensor(arr, dtype=like.dtype).to_global(placement=like.placement, sbp=like.sbp)
    return flow.tensor(arr, dtype=like.dtype, device=like.device)


def local_cpu_memory(param, dtype):
    """A local CPU parameter's own memory as a writable NumPy array (OneFlow's ``numpy()`` of a CPU
    tensor shares it, once the tensor's pending work is done), when it holds ``dtype``; else None."""
    if param.is_global or param.device.type != "cpu" or np.dtype(dtype) != np.float32 or param.dtype != flow.float32:
        return None
    mem = param.numpy()
    return mem if mem.flags["WRITEABLE"] and mem.flags["C_CONTIGUOUS"] and not mem.flags["OWNDATA"] else None


def copy_in(param, arr) -> None:
    """Copy a numpy array into a (local or global) parameter of the same shape; under no_grad."""
    param.copy_(placed_like(arr, param))


def to_local_full(t):
    """A global tensor as this rank's full local copy (no communication when broadcast)."""
    if not t.is_global:
        return t
    if any(s != flow.sbp.broadcast for s in t.sbp):
        t = t.to_global(sbp=flow.sbp.broadcast)
    return t.to_local()


def local_state(module) -> dict:
    """state_dict with global tensors as full local tensors."""
    return {k: to_local_full(v) for k, v in module.state_dict().items()}
