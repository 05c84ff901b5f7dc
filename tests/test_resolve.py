"""The one resolver behind `pretrain --init-checkpoint` and `finetune/predict/eval --model`: a bert_of
folder as it is, another format read in memory or converted into a temporary folder, a zoo name
through the local zoo, and one line for anything else."""

import os

import numpy as np
import pytest

from bert_of.config import BertConfig
from bert_of.converters.convert import convert
from bert_of.errors import ConfigError
from bert_of.modeling import BertForPreTraining
from bert_of.resolve import resolve_model
from tests.conftest import TINY, write_vocab


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("resolve")
    model = BertForPreTraining(BertConfig.from_google_dict(TINY))
    model.init_weights(seed=5)
    path = str(d / "tiny")
    model.save_pretrained(path, vocab_file=write_vocab(d / "vocab.txt", TINY["vocab_size"]))
    hf = str(d / "tiny-hf")
    convert("of2hf", path, hf)
    return path, hf, model.canonical_state()


def test_bert_of_folder_and_another_format(ckpt):
    path, hf, state = ckpt
    m = resolve_model(path)
    assert (m.path, m.name, m.fmt) == (path, "tiny", "of")
    with m.folder() as folder:
        assert folder == path
    h = resolve_model(hf, "--init-checkpoint")
    assert h.fmt == "hf" and h.name == "tiny-hf"
    in_memory = h.load()
    with h.folder() as folder:
        converted = resolve_model(folder).load()
        assert folder != hf and os.path.isfile(os.path.join(folder, "model.safetensors"))
    assert not os.path.exists(folder)  # the temporary conversion is gone
    for name, want in state.items():
        np.testing.assert_array_equal(in_memory.tensors[name], want, err_msg=name)
        np.testing.assert_array_equal(converted.tensors[name], want, err_msg=name)


def test_zoo_names_and_unknown_names(ckpt, tmp_path, monkeypatch):
    from bert_of.zoo.cli import main as zoo_main

    monkeypatch.setenv("BERT_OF_HOME", str(tmp_path / "home"))
    assert zoo_main(["add", ckpt[0], "--name", "resolve-me"]) == 0
    m = resolve_model("resolve-me")
    assert m.name == "resolve-me" and m.fmt == "of" and os.path.isfile(os.path.join(m.path, "model.safetensors"))
    with pytest.raises(ConfigError) as e:
        resolve_model("no-such-model", "--init-checkpoint")
    assert str(e.value) == ("--init-checkpoint no-such-model: no such checkpoint folder, and not a zoo name "
                            "(`bert-of zoo list` shows the names)")
