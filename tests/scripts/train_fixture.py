"""One tiny pretraining setup shared by single- and multi-process tests."""

import numpy as np

CONFIG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              max_position_embeddings=40, type_vocab_size=2, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)
TRAIN = dict(optimizer="adamw", lr=1e-3, warmup_steps=2, steps=20, weight_decay=0.01, clip_grad_norm=1.0)
STEPS = 6
B, S, P = 8, 16, 4


def global_batch(step: int) -> dict:
    """A deterministic global batch (B rows) of pretraining features for ``step``."""
    r = np.random.default_rng(1000 + step)
    w = np.ones((B, P), np.float32)
    w[:, -1] = r.integers(0, 2, B)  # some padded predictions
    return dict(input_ids=r.integers(5, 99, (B, S)), token_type_ids=(np.arange(S) >= S // 2).astype(np.int64)[None].repeat(B, 0),
                attention_mask=np.ones((B, S), np.int64), masked_lm_positions=np.sort(r.choice(np.arange(1, S), (B, P)), 1),
                masked_lm_ids=r.integers(5, 99, (B, P)), masked_lm_weights=w, next_sentence_labels=r.integers(0, 2, B))
