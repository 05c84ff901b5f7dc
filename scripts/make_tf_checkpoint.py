"""Make a checkpoint in Google's original TF1 layout with TensorFlow's own Saver.

No real Google weights can be downloaded here, so the demo and the benchmark
build one: Google's variable names, bert_config.json and a vocab.txt, with
weights of realistic magnitude (see converters/verify/tf_reference_checkpoint.py).

    python scripts/make_tf_checkpoint.py DIR [--layers 4 --hidden 256 --heads 4 --intermediate 1024]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--max-position", type=int, default=512)
    p.add_argument("--with-optimizer", action="store_true")
    p.add_argument("--global-step", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    from bert_of.converters.verify import tf_reference_checkpoint as ref

    cfg = dict(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
               intermediate_size=a.intermediate, hidden_act="gelu", hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1, max_position_embeddings=a.max_position, type_vocab_size=2,
               initializer_range=0.02)
    os.makedirs(a.dir, exist_ok=True)
    ref.make_checkpoint(os.path.join(a.dir, "bert_model.ckpt"), cfg, seed=a.seed, heads=("pretraining",),
                        realistic=True, with_optimizer=a.with_optimizer, global_step=a.global_step)
    with open(os.path.join(a.dir, "bert_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    specials = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = specials + [f"w{i}" for i in range(a.vocab - len(specials))]
    with open(os.path.join(a.dir, "vocab.txt"), "w") as f:
        f.write("\n".join(words[:a.vocab]) + "\n")
    print(f"wrote {a.dir}: Google TF1 layout, L={a.layers} H={a.hidden} A={a.heads} I={a.intermediate} V={a.vocab}")


if __name__ == "__main__":
    main()
