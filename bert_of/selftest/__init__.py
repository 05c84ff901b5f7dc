"""``bert-of selftest``: check a machine in one command (every CUDA path on a GPU machine).

:mod:`~bert_of.selftest.cli` is the command line (cheap to import); :mod:`~bert_of.selftest.checks`
the checks, and the throughput worker (``python -m bert_of.selftest.checks --worker ...``).
"""
