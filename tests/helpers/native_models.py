"""OneFlow modules written for the tests with the parameter names, structure and forward math of
the BERTs whose flow.save folders bert_of reads: Oneflow-Inc/models ``NLP/BERT`` (current and the
older bare-Parameter revision) and LiBai's BertModel / BertForPreTraining / BertForClassification.

Written here from what those codebases compute (see converters/formats/oneflow_native/ofmodels.py and converters/formats/oneflow_native/libai.py);
none of their code is in this repository. Each module's ``state_dict()`` has the keys the original
has, so ``flow.save(module.state_dict(), dir)`` makes the folder those codebases make, and its
forward is the reference the conversions are checked against.
"""

import math

import numpy as np

from bert_of._flow import flow

nn = flow.nn


# --------------------------------------------------------------------------- Oneflow-Inc/models NLP/BERT


class _Linear(nn.Module):
    def __init__(self, i, o, bias=True):
        super().__init__()
        self.weight = nn.Parameter(flow.zeros(o, i))
        self.bias = nn.Parameter(flow.zeros(o)) if bias else None

    def forward(self, x):
        y = flow.matmul(x, self.weight, transpose_b=True)
        return y + self.bias if self.bias is not None else y


class ModelsEmbeddings(nn.Module):
    def __init__(self, c, old=False):
        super().__init__()
        self.old = old
        H = c["hidden_size"]
        if old:  # the older revision: bare Parameters
            self.word_embeddings = nn.Parameter(flow.zeros(c["vocab_size"], H))
            self.position_embeddings = nn.Parameter(flow.zeros(c["max_position_embeddings"], H))
            self.tokentype_embeddings = nn.Parameter(flow.zeros(c["type_vocab_size"], H))
        else:
            self.word_embeddings = nn.Embedding(c["vocab_size"], H)
            self.position_embeddings = nn.Embedding(c["max_position_embeddings"], H)
            self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], H)
        self.LayerNorm = nn.LayerNorm(H)
        if not old:
            self.register_buffer("position_ids", flow.arange(c["max_position_embeddings"]).unsqueeze(0))

    def tables(self):
        if self.old:
            return self.word_embeddings, self.position_embeddings, self.tokentype_embeddings
        return self.word_embeddings.weight, self.position_embeddings.weight, self.token_type_embeddings.weight

    def forward(self, ids, types):
        w, p, t = self.tables()
        S = ids.shape[1]
        pos = flow.arange(S).unsqueeze(0) if self.old else self.position_ids[:, :S]
        emb = flow.nn.functional.embedding
        x = emb(ids, w) + emb(types, t) + emb(pos, p)
        return self.LayerNorm(x)


class ModelsLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.heads = c["atten_heads"]
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        for n in ("query", "key", "value"):
            setattr(self.attention.self, n, nn.Linear(H, H))
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(H, H)
        self.attention.output.LayerNorm = nn.LayerNorm(H)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(H, I)
        self.output = nn.Module()
        self.output.dense = nn.Linear(I, H)
        self.output.LayerNorm = nn.LayerNorm(H)

    def forward(self, h, mask_add):
        B, S, H = h.shape
        N, D = self.heads, H // self.heads
        sa = self.attention.self

        def heads(x):
            return x.reshape(B, S, N, D).permute(0, 2, 1, 3)

        q, k, v = heads(sa.query(h)), heads(sa.key(h)), heads(sa.value(h))
        scores = flow.matmul(q, k, transpose_b=True) / math.sqrt(D) + mask_add
        ctx = flow.matmul(flow.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(B, S, H)
        a = self.attention.output.LayerNorm(self.attention.output.dense(ctx) + h)
        m = self.output.dense(flow.nn.functional.gelu(self.intermediate.dense(a)))
        return self.output.LayerNorm(m + a)


class ModelsBertModel(nn.Module):
    def __init__(self, c, old=False):
        super().__init__()
        self.embeddings = ModelsEmbeddings(c, old)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList([ModelsLayer(c) for _ in range(c["hidden_layers"])])
        self.pooler = nn.Module()
        self.pooler.dense = nn.Linear(c["hidden_size"], c["hidden_size"])

    def forward(self, ids, types, mask):
        # (mask - 1) * 10000, added to the scores
        mask_add = (mask.to(flow.float32).reshape(mask.shape[0], 1, 1, -1) - 1.0) * 10000.0
        h = self.embeddings(ids, types)
        for layer in self.encoder.layer:
            h = layer(h, mask_add)
        return h, flow.tanh(self.pooler.dense(h[:, 0]))


class ModelsBertForPreTraining(nn.Module):
    """BertForPreTraining of the models repo: decoder.weight IS the word embeddings, decoder.bias IS output_bias."""

    def __init__(self, c, old=False):
        super().__init__()
        H, V = c["hidden_size"], c["vocab_size"]
        self.bert = ModelsBertModel(c, old)
        self.cls = nn.Module()
        p = self.cls.predictions = nn.Module()
        if old:
            self.output_bias = nn.Parameter(flow.zeros(V))
        else:
            p.output_bias = nn.Parameter(flow.zeros(V))
        p.transform = nn.Module()
        p.transform.dense = nn.Linear(H, H)
        p.transform.LayerNorm = nn.LayerNorm(H)
        if not old:
            p.decoder = nn.Linear(H, V, bias=False)
            p.decoder.weight = self.bert.embeddings.word_embeddings.weight
            p.decoder.bias = p.output_bias
        self.cls.seq_relationship = nn.Linear(H, 2)
        self.old = old

    def forward(self, ids, types, mask):
        seq, pooled = self.bert(ids, types, mask)
        p = self.cls.predictions
        t = p.transform.LayerNorm(flow.nn.functional.gelu(p.transform.dense(seq)))
        if self.old:
            mlm = flow.matmul(t, self.bert.embeddings.word_embeddings, transpose_b=True) + self.output_bias
        else:
            mlm = p.decoder(t)
        return {"sequence_output": seq, "pooled_output": pooled, "prediction_logits": mlm,
                "seq_relationship_logits": self.cls.seq_relationship(pooled)}


class ModelsSQuAD(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = ModelsBertModel(c)
        self.cls_squad = nn.Linear(c["hidden_size"], 2)

    def forward(self, ids, types, mask):
        seq, pooled = self.bert(ids, types, mask)
        logits = self.cls_squad(seq)
        return {"sequence_output": seq, "pooled_output": pooled, "start_logits": logits[:, :, 0],
                "end_logits": logits[:, :, 1]}


# --------------------------------------------------------------------------- LiBai


class PlainLayerNorm(nn.Module):
    """LiBai's LayerNorm parameters, given the plain formula (OneFlow 0.9's CPU layer_norm_affine aborts)."""

    def __init__(self, H, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(flow.ones(H))
        self.bias = nn.Parameter(flow.zeros(H))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(-1, keepdim=True)
        return xc * flow.rsqrt(var + self.eps) * self.weight + self.bias


class LibaiLayer(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        H, I, eps = cfg["hidden_size"], cfg["intermediate_size"], cfg["layernorm_eps"]
        self.N = cfg["num_attention_heads"]
        self.post = cfg["apply_residual_post_layernorm"]
        D = H // self.N
        self.norm_factor = 1.0 / math.sqrt(float(D))
        self.coeff = None
        if cfg["apply_query_key_layer_scaling"]:
            self.coeff = i + 1
            self.norm_factor /= self.coeff
        self.input_layernorm = PlainLayerNorm(H, eps)
        self.self_attention = nn.Module()
        self.self_attention.query_key_value = _Linear(H, 3 * H)
        self.self_attention.dense = _Linear(H, H)
        self.post_attention_layernorm = PlainLayerNorm(H, eps)
        self.mlp = nn.Module()
        self.mlp.dense_h_to_4h = _Linear(H, I)
        self.mlp.dense_4h_to_h = _Linear(I, H)

    def attention(self, x, mask):
        B, S, H = x.shape
        N, D = self.N, H // self.N
        qkv = self.self_attention.query_key_value(x).view(B, S, N, 3 * D).permute(0, 2, 1, 3)
        q, k, v = flow.chunk(qkv, chunks=3, dim=-1)
        scores = flow.matmul(q, k, transpose_b=True, alpha=self.norm_factor)
        if self.coeff is not None:
            scores = scores * self.coeff
        scores = flow.mul(scores, mask)
        scores = scores - 10000.0 * (1 - mask)
        ctx = flow.matmul(flow.softmax(scores, dim=-1), v).transpose(1, 2)
        return self.self_attention.dense(ctx.flatten(2))

    def forward(self, h, mask):
        ln = self.input_layernorm(h)
        a = self.attention(ln, mask)
        h = (ln if self.post else h) + a
        ln = self.post_attention_layernorm(h)
        m = self.mlp.dense_4h_to_h(flow.nn.functional.gelu(self.mlp.dense_h_to_4h(ln)))
        return (ln if self.post else h) + m


class LibaiBertModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.embeddings = nn.Module()
        self.embeddings.vocab_embeddings = nn.Embedding(cfg["vocab_size"], H)
        self.embeddings.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], H)
        self.embeddings.tokentype_embeddings = nn.Embedding(cfg["num_tokentypes"], H)
        self.encoders = nn.ModuleList([LibaiLayer(cfg, i) for i in range(cfg["hidden_layers"])])
        self.final_layernorm = PlainLayerNorm(H, cfg["layernorm_eps"])
        self.pooler = None
        if cfg.get("add_pooling_layer", True):
            self.pooler = nn.Module()
            self.pooler.dense = _Linear(H, H)

    def forward(self, ids, mask, types):
        e = self.embeddings
        S = ids.shape[1]
        emb = flow.nn.functional.embedding
        x = emb(ids, e.vocab_embeddings.weight) + emb(flow.arange(S).unsqueeze(0), e.position_embeddings.weight)
        x = x + emb(types, e.tokentype_embeddings.weight)
        m = mask.to(flow.float32)
        ext = (m.unsqueeze(1) * m.unsqueeze(2)).unsqueeze(1)  # [B, 1, S, S]: query AND key masked
        for layer in self.encoders:
            x = layer(x, ext)
        seq = self.final_layernorm(x)
        return seq, (flow.tanh(self.pooler.dense(seq[:, 0, :])) if self.pooler is not None else None)


class LibaiBertForPreTraining(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, V = cfg["hidden_size"], cfg["vocab_size"]
        self.bert = LibaiBertModel(cfg)
        self.cls_head = nn.Module()
        self.cls_head.predictions = nn.Module()
        self.cls_head.predictions.dense = _Linear(H, H)
        self.cls_head.predictions.layernorm = PlainLayerNorm(H)  # LiBai's default eps 1e-5, whatever the cfg
        self.cls_head.seq_relationship = _Linear(H, 2)
        self.cls_head.lm_logits = nn.Module()
        self.cls_head.lm_logits.bias = nn.Parameter(flow.zeros(V))

    def forward(self, ids, types, mask):
        seq, pooled = self.bert(ids, mask, types)
        p = self.cls_head.predictions
        t = p.layernorm(flow.nn.functional.gelu(p.dense(seq)))
        logits = flow.matmul(t, self.bert.embeddings.vocab_embeddings.weight, transpose_b=True) + \
            self.cls_head.lm_logits.bias
        return {"sequence_output": seq, "pooled_output": pooled, "prediction_logits": logits,
                "seq_relationship_logits": self.cls_head.seq_relationship(pooled)}


class LibaiBertForClassification(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.bert = LibaiBertModel(cfg)
        self.classifier = _Linear(cfg["hidden_size"], cfg["num_labels"])

    def forward(self, ids, types, mask):
        seq, pooled = self.bert(ids, mask, types)
        return {"sequence_output": seq, "pooled_output": pooled, "logits": self.classifier(pooled)}


def randomize(module, seed, scale=0.2):
    """Every parameter drawn at a realistic magnitude (tanh/erf GELU and eps differences show)."""
    rng = np.random.default_rng(seed)
    with flow.no_grad():
        seen = set()
        for name, p in module.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name.endswith("layernorm.weight") or name.endswith("LayerNorm.weight"):
                v = 1.0 + 0.2 * rng.standard_normal(tuple(p.shape))
            else:
                v = scale * rng.standard_normal(tuple(p.shape))
            p.copy_(flow.tensor(v.astype(np.float32)))
    return module


def run(module, batch):
    module.eval()
    args = [flow.tensor(batch[k], dtype=flow.int64) for k in ("input_ids", "token_type_ids", "attention_mask")]
    with flow.no_grad():
        out = module(*args)
    out = out if isinstance(out, dict) else out.to_dict()  # bert_of's output classes
    return {k: v.numpy() for k, v in out.items() if v is not None}
