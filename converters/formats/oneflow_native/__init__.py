"""OneFlow's own saved BERTs (``flow.save`` folders): bert_of's module state dict (``ofsd``),
Oneflow-Inc/models' BERT (``ofmodels``) and LiBai's (``libai``), sharing their steps (``steps``) and
config finding (``config``). The ``flow.save`` container itself is ``converters/containers/flow_save.py``.
"""
