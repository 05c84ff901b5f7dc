"""The anchor: HuggingFace transformers' TF1 route, as its docs and scripts do it.

BertForPreTraining(config) + load_tf_weights_in_bert(...) + save_pretrained (safetensors).
Runs in the anchor environment (.venv-anchor: Python 3.11, torch, transformers 4.x, TF).
Usage: hf_tf_route.py SRC_DIR DST_DIR
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from transformers import BertConfig, BertForPreTraining, load_tf_weights_in_bert  # noqa: E402

src, dst = sys.argv[1:3]
config = BertConfig.from_json_file(os.path.join(src, "bert_config.json"))
model = BertForPreTraining(config)
load_tf_weights_in_bert(model, config, os.path.join(src, "bert_model.ckpt"))
model.save_pretrained(dst)
