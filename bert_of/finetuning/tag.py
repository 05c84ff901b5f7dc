"""Token tagging (NER) on a user's CoNLL-2003-style or JSON Lines file.

    finetune_tag(TagOptions(...)) / predict_tag(...) / eval_tag(...)

Each word is WordPiece-tokenised; its tag is learned and predicted on its first sub-token (later
sub-tokens, [CLS], [SEP] and padding carry ``IGNORE_INDEX``: transformers' NER example). Words past
``max_seq_length`` are predicted ``O``. Scores are entity-level precision / recall / F1 as
conlleval and seqeval define them (:func:`bert_of.eval.user_data.entity_scores`). The tag order is
recorded in train_args.json (``labels``) and, as ``id2label``, in the model's config.json (HF's
BertForTokenClassification after ``convert of2hf``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bert_of.errors import ConfigError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.user_data import entity_scores, free_name, read_tagged, tag_list
from bert_of.files.atomic import atomic_open
from bert_of.finetuning.task import Help, ModelRun, Task
from bert_of.inputs import IGNORE_INDEX
from bert_of.options import TRAINING, arg
from bert_of.finetuning.options import EVAL, GLUE_MAX_SEQ_LENGTH, PREDICT, RUNS, RUN_FOLDER, TRAIN, TaskOptions
from bert_of.progress import note, progress_iter

if TYPE_CHECKING:  # annotations only: the shared steps bring it when a task runs
    from bert_of.training.runtime import Runtime


TAGGING = "tagging"


@dataclass(kw_only=True)
class TagOptions(TaskOptions):
    """``bert-of finetune tag`` / ``predict tag`` / ``eval tag``: CoNLL-2003-style files or JSON Lines
    with ``tokens`` and ``tags`` (a tag on each word's first WordPiece, as transformers' NER example)."""

    data: str | None = arg(None, metavar="FILE", commands=RUNS, required=True, path=True,
                           help="CoNLL file (token first, tag last) or JSON Lines with tokens (tags not needed)",
                           helps={EVAL: "tagged CoNLL file or JSON Lines with tokens and tags"})
    output: str | None = arg(None, short="-o", metavar="PATH", required=(PREDICT,), path=True,
                             help="folder for predictions.jsonl (tokens, tags), or the predictions file itself: "
                                  "JSON Lines when it ends .jsonl, CoNLL (token TAB tag) when .conll, .txt or .tsv",
                             helps={TRAIN: RUN_FOLDER,
                                    EVAL: "folder for predictions.jsonl (unset: $BERT_OF_HOME/eval/MODEL/"
                                          "tag-DATA-TIME/)"})
    lr: float = arg(5e-5, help="peak learning rate", metavar="LR", group=TRAINING, commands=(TRAIN,))
    epochs: float = arg(3.0, help="epochs", metavar="E", group=TRAINING, commands=(TRAIN,))
    max_seq_length: int | None = arg(None, metavar="N", group=TAGGING,
                                     help=f"WordPieces per sentence (unset: {GLUE_MAX_SEQ_LENGTH}; prediction: as "
                                          "the model was trained); words past it are tagged O")


NAME = "tag"
PREDICTIONS_FILE = "predictions.jsonl"
JSONL = (".jsonl", ".ndjson", ".json")  # read_tagged reads these as JSON Lines


@dataclass
class TagRun(ModelRun):
    sentences: list
    labels: list
    predictions: list  # one tag list per sentence, a tag per word
    path: str


def tag_features(sentences, labels, max_seq: int, tok, path: str) -> tuple:
    """(arrays named like the model's forward arguments, first-sub-token positions per sentence).

    ``labels``: the tag order, or None (no tags: every label IGNORE_INDEX)."""
    index = {t: i for i, t in enumerate(labels or [])}
    n = len(sentences)
    ids = np.zeros((n, max_seq), np.int64)
    mask = np.zeros((n, max_seq), np.int64)
    tags = np.full((n, max_seq), IGNORE_INDEX, np.int64)
    firsts = []
    for i, s in enumerate(progress_iter(sentences, "tagging features", unit="sentence")):
        pieces, first = ["[CLS]"], []
        for j, word in enumerate(s.tokens):
            wp = list(tok.tokenize(word)) or ["[UNK]"]
            if len(pieces) + len(wp) > max_seq - 1:
                break  # this word and the rest do not fit: predicted O
            if labels is not None and s.tags is not None:
                if s.tags[j] not in index:
                    where = (f"line {s.line}: column 'tags', item {j + 1}" if path.lower().endswith(JSONL)
                             else f"line {s.line + j}")  # CoNLL: a word a line
                    raise EvalDataError(f"{path}: {where}: tag {s.tags[j]!r} is not one of the model's tags "
                                        f"({', '.join(labels)})")
                tags[i, len(pieces)] = index[s.tags[j]]
            first.append(len(pieces))
            pieces += wp
        pieces.append("[SEP]")
        ids[i, :len(pieces)] = tok.convert_tokens_to_ids(pieces)
        mask[i, :len(pieces)] = 1
        firsts.append(first)
    return {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask, "labels": tags}, firsts


def _known_tags(path: str, labels: list) -> None:
    """``path`` is tagged data whose tags are all among ``labels`` (the training's)."""
    for s in read_tagged(path, need_tags=True):
        for j, t in enumerate(s.tags):
            if t not in labels:
                where = f"line {s.line}" if path.lower().endswith(JSONL) else f"line {s.line + j}"
                raise EvalDataError(f"{path}: {where}: tag {t!r} is not one of the tags of the training data "
                                    f"({', '.join(labels)})")


def finetune_tag(opts: TagOptions) -> dict:
    from bert_of.finetuning.driver import (Runtime, base_args, check_eval_data, check_output, finish_finetuning,
                                            train)  # loads OneFlow: only when the task runs
    from bert_of.finetuning.steps import (check_head, check_seq_len, glue_seq_len, load_model, make_tokenizer,
                                          model_folder)
    from bert_of.heads import BertForTokenClassification
    rt = Runtime.create(opts.device)
    check_output(opts)
    sentences = read_tagged(opts.train)
    labels = tag_list(sentences)
    if len(labels) < 2:
        raise EvalDataError(f"{opts.train}: one tag ({labels[0]}); tagging needs two or more")
    check_eval_data(opts, lambda d: _known_tags(d, labels))
    max_seq = glue_seq_len(opts, {})
    with model_folder(opts) as (path, name, ident):
        check_head(path, len(labels), NAME, name)
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt, ident)
        model, _ = load_model(BertForTokenClassification, path, seed=opts.seed, num_labels=len(labels),
                              id2label=dict(enumerate(labels)))  # the tag names travel in config.json
        max_seq = check_seq_len(model.config, max_seq, path, rt, given=opts.max_seq_length is not None)
        if opts.vocab:
            model.vocab_file = opts.vocab
        arrays, _ = tag_features(sentences, labels, max_seq, tok, opts.train)
        cfg, summary, finished = train(model, arrays, len(sentences), opts, opts.epochs, rt, f"finetune {NAME}")
        args = base_args(NAME, opts, cfg, opts.epochs, rt, ident, name, tok)
        args["hparams"].update(max_seq_length=max_seq)
        args.update(labels=labels, id2label={str(i): t for i, t in enumerate(labels)},
                    label2id={t: i for i, t in enumerate(labels)}, train_examples=len(sentences))
        return finish_finetuning(model, opts, rt, args, summary, finished, path, eval_tag)


def predict_tag(opts: TagOptions, trained: str | None = None, model=None, rt: Runtime | None = None,
                need_tags: bool = False, out_file: str | None = None) -> TagRun | None:
    """A tag per word of every sentence of ``opts.data``; rank 0 writes them beside the input to
    ``out_file`` (default ``opts.output``; :func:`_write_tags`)."""
    from bert_of.finetuning.steps import (check_head, check_seq_len, glue_seq_len, load_predictor, make_tokenizer,
                                          model_folder, predict_mode, predict_runtime, read_train_args)
    from bert_of.training.inference import infer
    rt = rt or predict_runtime(opts)
    out_file = out_file or opts.output
    if not out_file:
        raise ConfigError("predict tag: no -o FILE")
    with model_folder(opts, trained) as (path, name, ident):
        train_args = read_train_args(path)
        labels = train_args.get("labels")
        if train_args.get("task") != NAME or not isinstance(labels, list):
            raise ConfigError(f"{name}: not fine-tuned by `bert-of finetune tag` (its train_args.json records no "
                              "tagging labels)")
        sentences = read_tagged(opts.data, need_tags=need_tags)
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt, ident)  # train_args.json's, unless given
        max_seq = glue_seq_len(opts, train_args)
        new_head = False
        if model is None:
            check_head(path, len(labels), NAME, name)
            model, missing = load_predictor("BertForTokenClassification", path, name, opts, rt, num_labels=len(labels))
            new_head = bool(missing)
        max_seq = check_seq_len(model.config, max_seq, path, rt, given=opts.max_seq_length is not None)
        arrays, firsts = tag_features(sentences, labels if need_tags else None, max_seq, tok, opts.data)
        inputs = [arrays[k] for k in ("input_ids", "token_type_ids", "attention_mask")]
        (logits,) = infer(model, inputs, ("logits",), opts.predict_batch_size, mode := predict_mode(opts, rt), rt,
                          pad_to_batch=not opts.pad_to_max_length, positions=("logits",))
        best = logits.argmax(axis=-1)  # [n, S]
        preds = []
        for i, s in enumerate(sentences):
            got = [labels[int(best[i, p])] for p in firsts[i]]
            preds.append(got + ["O"] * (len(s.tokens) - len(got)))
        settings = {"max_seq_length": max_seq, "do_lower_case": tok.do_lower_case, "predict_mode": mode, "engine": opts.engine}
        if not rt.is_main:
            return None
        _write_tags(out_file, opts.data, sentences, preds, rt)
        note(rt, f"tagged {len(sentences)} sentences of {opts.data}; wrote {out_file}")
        return TagRun(sentences=sentences, labels=labels, predictions=preds, path=out_file, model_path=path,
                      model_name=name, identity_path=ident, train_args=train_args, new_head=new_head,
                      settings=settings)


def _write_tags(path: str, data: str, sentences: list, preds: list, rt=None) -> None:
    """The input beside its predictions, sentence by sentence in input order. CoNLL (``path`` not
    .jsonl): each word's line, its columns as read (tag included) joined by tabs, then the predicted
    tag; a blank line between sentences. JSON Lines: each sentence's object as read (a CoNLL input's:
    ``tokens``, and ``tags`` when it has them) with ``prediction``, the tag list (``prediction.1``...
    when the input has that key, with a note)."""
    renamed = set()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_open(path) as f:
        for s, tags in zip(sentences, preds):
            if path.lower().endswith(".jsonl"):
                rec = s.record if s.record is not None else \
                    {"tokens": s.tokens, **({"tags": s.tags} if s.tags and None not in s.tags else {})}
                key = free_name("prediction", rec)
                if key != "prediction":
                    renamed.add(key)
                f.write(json.dumps({**rec, key: tags}, ensure_ascii=False) + "\n")
            else:
                fields = s.fields or [[w] + ([t] if t is not None else []) for w, t in
                                      zip(s.tokens, s.tags or [None] * len(s.tokens))]
                f.write("".join("\t".join(cols + [t]) + "\n" for cols, t in zip(fields, tags)) + "\n")
    if renamed:
        note(rt, f"note: {data} has a 'prediction' key: the predicted tags are under {', '.join(sorted(renamed))}")


def eval_tag(opts: TagOptions, trained: str | None = None, model=None, rt: Runtime | None = None) -> dict | None:
    """Predict a tagged file, score it (entity precision / recall / F1, token accuracy), print the
    scores as JSON and record them."""
    from bert_of.finetuning.steps import default_eval_dir, model_display_name, percent, predict_runtime, record
    rt = rt or predict_runtime(opts)
    if not opts.output:
        opts.output = default_eval_dir(model_display_name(opts.model), opts.data, NAME)
    run = predict_tag(opts, trained=trained, model=model, rt=rt, need_tags=True,
                      out_file=os.path.join(opts.output, PREDICTIONS_FILE))
    if run is None:
        return None
    metrics = percent(entity_scores([s.tags for s in run.sentences], run.predictions), rt)
    print(json.dumps({"task": NAME, "examples": len(run.sentences), **metrics}, indent=2), flush=True)
    record(opts, rt, NAME, metrics, run, pred_path=run.path, tool="bert-of eval tag")
    return metrics


class TagTask(Task):
    name = "tag"
    options = TagOptions
    predictions_file = PREDICTIONS_FILE
    file_kinds = ()
    helps = {
        TRAIN: Help(
            'token tagging (NER) on CoNLL-2003-style or JSON Lines files',
            "Fine-tune a token classifier: each word's tag on its first WordPiece (transformers' NER "
            'example); tags sorted (O first) and recorded in the model.',
            ('bert-of finetune tag --model bert-base-cased --no-lower-case --train train.conll -o ner-model/ '
             '--eval-data dev.conll',)),
        PREDICT: Help(
            'a tag per word (CoNLL or JSON Lines)',
            'Tag every word of a CoNLL / JSON Lines file (tags not needed) with a model from `bert-of '
            'finetune tag`; writes OUTPUT as JSON Lines (tokens, tags) when it ends .jsonl, else CoNLL '
            '(token TAB tag, a blank line between sentences).',
            ('bert-of predict tag --model ner-model/ --data new.conll -o tagged.conll',)),
        EVAL: Help(
            'tag a labeled CoNLL / JSON Lines file with a model, score it (entities) and record it',
            'Tag DATA with a model from `bert-of finetune tag`, write OUTPUT/predictions.jsonl, score it '
            '(entity-level precision, recall, F1 as conlleval / seqeval; token accuracy), print that JSON '
            'and append it to the results store.',
            ('bert-of eval tag --model ner-model/ --data dev.conll',)),
    }

    def finetune(self, opts):
        return finetune_tag(opts)

    def predict(self, opts, trained=None, model=None, rt=None):
        return predict_tag(opts, trained, model, rt)

    def evaluate(self, opts, trained=None, model=None, rt=None):
        return eval_tag(opts, trained, model, rt)


TASK = TagTask()
