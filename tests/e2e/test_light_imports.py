"""Light modules stay light: importing them, in a fresh interpreter, loads no heavy dependency."""

import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.helpers.models import minilm_dir


def test_the_tokenizer_imports_neither_oneflow_nor_numpy():
    uncased = os.path.join(minilm_dir(), "vocab.txt")
    code = ("import sys; from bert_of.tokenization import FullTokenizer; "
            f"FullTokenizer({uncased!r}).encode('hi there'); "
            "assert 'oneflow' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))


def test_the_tf_bundle_reader_imports_neither_tensorflow_nor_oneflow():
    code = (
        "import sys, bert_of.converters.containers.tf1_bundle;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('tensorflow','oneflow','ml_dtypes')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
