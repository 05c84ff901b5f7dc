"""SQuAD / GLUE evaluation: official-equivalent metrics, data processing, the results store.

Modules (import what you need; nothing here loads OneFlow):

* :mod:`bert_of.eval.squad_metrics` -- ``squad_score`` and the v1.1 / v2.0 scorers (``bert-of eval squad-score``);
* :mod:`bert_of.eval.squad_data` -- SQuAD json -> examples -> model features (run_squad.py semantics);
* :mod:`bert_of.eval.squad_predictions` -- start/end logits -> predictions.json / nbest_predictions.json /
  null_odds.json (run_squad.py semantics);
* :mod:`bert_of.eval.glue_data` -- GLUE / XNLI TSV readers, classifier features;
* :mod:`bert_of.eval.glue_metrics` -- numpy metrics, predictions files, ``glue_score`` (``bert-of eval glue-score``);
* :mod:`bert_of.eval.results` -- the JSON-lines results store and its table (``bert-of results``);
* :mod:`bert_of.eval.cli` -- the commands; ``add_parser(subparsers)`` mounts them on ``bert-of``.
"""
