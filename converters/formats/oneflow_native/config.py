"""Configs of OneFlow's own BERTs, where they live, read into a BertConfig.

A ``flow.save`` folder holds weights only. Its config is found (``--config`` first) as

- ``config.yaml`` of a LiBai run: ``output_dir/config.yaml`` beside ``output_dir/model_final/model/``
  (LiBai's ``LazyConfig.save``: ``yaml.dump(..., default_flow_style=None)``); the model's
  settings are its ``model.cfg`` mapping;
- ``config.json`` / ``bert_config.json`` in the folder or beside it.

Any of them may hold LiBai's keys (``hidden_layers``, ``num_tokentypes``, ``layernorm_eps``,
``apply_residual_post_layernorm`` ...), the Oneflow-Inc/models ``BertForPreTraining`` constructor
arguments (``hidden_layers``, ``atten_heads``, ``seq_length`` ...), a bert_of config (it has
``provenance``), an HF config (``model_type``) or Google's ``bert_config.json``; JSON or YAML.

PyYAML is not a dependency of bert_of: :func:`parse_yaml` reads the subset ``yaml.dump`` writes
for a LiBai config (block mappings, one-line flow mappings and lists, plain and quoted scalars
with YAML 1.1's int/float/bool/null rules); anything else is one clear error.
"""

from __future__ import annotations

import json
import math
import os
import re

from bert_of.config import BertConfig
from bert_of.errors import ConfigError
from bert_of.files.reading import read_bounded, read_json
from bert_of.converters.formats.hf.config import config_from_hf

CONFIG_NAMES = ("config.json", "bert_config.json")
LIBAI_RUN_CONFIG = "config.yaml"
_MAX_CONFIG = 4 << 20

# LiBai cfg key -> BertConfig field
LIBAI_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "hidden_layers": "num_hidden_layers",
              "num_attention_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
              "hidden_dropout_prob": "hidden_dropout_prob",
              "attention_probs_dropout_prob": "attention_probs_dropout_prob",
              "max_position_embeddings": "max_position_embeddings", "num_tokentypes": "type_vocab_size",
              "initializer_range": "initializer_range", "layernorm_eps": "layer_norm_eps",
              "num_labels": "num_labels"}
# LiBai BertModel's own defaults (libai/models/bert_model.py) for keys a cfg may leave out.
LIBAI_DEFAULTS = {"num_tokentypes": 2, "initializer_range": 0.02, "layernorm_eps": 1e-12,
                  "apply_query_key_layer_scaling": True, "apply_residual_post_layernorm": False,
                  "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
LIBAI_HEAD_LN_EPS = 1e-5  # BertLMPredictionHead's LayerNorm: LiBai's LayerNorm default, whatever the cfg says
# Oneflow-Inc/models BertForPreTraining(...) argument -> BertConfig field
OFMODELS_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "hidden_layers": "num_hidden_layers",
                 "atten_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
                 "hidden_dropout_prob": "hidden_dropout_prob",
                 "attention_probs_dropout_prob": "attention_probs_dropout_prob",
                 "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
                 "initializer_range": "initializer_range"}
OFMODELS_DEFAULTS = {"max_position_embeddings": 512, "type_vocab_size": 16, "hidden_dropout_prob": 0.1,
                     "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}
OFMODELS_LN_EPS = 1e-5  # nn.LayerNorm's default: the models repo never sets it


# --------------------------------------------------------------------------- YAML subset


# YAML 1.1's int as PyYAML resolves it (yaml/resolver.py): binary, leading-0 octal, decimal, hex,
# base 60 (1:30 is 90); underscores anywhere after the prefix. "0o10" and "08" are strings there.
_INT = re.compile(r"[-+]?(0b[01_]+|0[0-7_]+|0|[1-9][0-9_]*|0x[0-9a-fA-F_]+|[1-9][0-9_]*(:[0-5]?[0-9])+)$")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9][0-9_]*)(\.[0-9_]*)?([eE][-+]?[0-9]+)?$")
_SEXAGESIMAL_FLOAT = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*$")


def _yaml_int(t: str, where: str) -> int:
    """PyYAML's construct_yaml_int of a string _INT matched."""
    v = t.replace("_", "")
    sign = -1 if v[0] == "-" else 1
    v = v.lstrip("+-")
    try:
        if v.startswith("0b"):
            return sign * int(v[2:], 2)
        if v.startswith("0x"):
            return sign * int(v[2:], 16)
        if v != "0" and v[0] == "0":
            return sign * int(v, 8)
    except ValueError:  # "0x_": PyYAML's constructor fails too
        raise ConfigError(f"{where}: {t!r} is not an integer (YAML 1.1)") from None
    return sign * _base60(v)


def _base60(v: str):
    """'190:20:30' -> 685230 (YAML 1.1's sexagesimal); a plain number as it is."""
    out = 0
    for part in v.split(":"):
        out = out * 60 + (float(part) if "." in part else int(part))
    return out


def _scalar(text: str, where: str):
    t = text.strip()
    if t.startswith("'"):
        if len(t) < 2 or not t.endswith("'"):
            raise ConfigError(f"{where}: unterminated quoted string {t[:40]!r}")
        return t[1:-1].replace("''", "'")
    if t.startswith('"'):
        try:
            return json.loads(t)
        except ValueError:
            raise ConfigError(f"{where}: quoted string {t[:40]!r} is not one bert_of reads") from None
    if t.startswith(("!", "&", "*", "|", ">")):
        raise ConfigError(f"{where}: YAML feature {t[:20]!r} (tags, anchors, block scalars) is not in the subset "
                          f"bert_of reads; give the config as JSON")
    low = t.lower()
    if low in ("", "~", "null"):
        return None
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in (".inf", "+.inf"):
        return math.inf
    if low == "-.inf":
        return -math.inf
    if low == ".nan":
        return math.nan
    if _INT.match(t):
        return _yaml_int(t, where)
    if _SEXAGESIMAL_FLOAT.match(t):
        v = t.replace("_", "")
        return (-1.0 if v[0] == "-" else 1.0) * _base60(v.lstrip("+-"))
    if _FLOAT.match(t) and any(c.isdigit() for c in t) and ("." in t or "e" in low):  # "08" is a string
        return float(t.replace("_", ""))
    return t


_MAX_FLOW_DEPTH = 64


def _flow(text: str, where: str):
    """A one-line flow collection ``{a: 1, b: [x, y]}`` or ``[1, 2]``."""
    pos = 0

    def value(depth=0):
        nonlocal pos
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos < len(text) and text[pos] in "{[" and depth >= _MAX_FLOW_DEPTH:
            raise ConfigError(f"{where}: flow collections nested over {_MAX_FLOW_DEPTH} deep (not a config)")
        if pos < len(text) and text[pos] in "{[":
            close = "}" if text[pos] == "{" else "]"
            is_map = text[pos] == "{"
            pos += 1
            out = {} if is_map else []
            while True:
                while pos < len(text) and text[pos] == " ":
                    pos += 1
                if pos < len(text) and text[pos] == close:
                    pos += 1
                    return out
                if is_map:
                    k = atom(":")
                    if pos >= len(text) or text[pos] != ":":
                        raise ConfigError(f"{where}: flow mapping without ':' near {text[pos:pos + 30]!r}")
                    pos += 1
                    out[k] = value(depth + 1)
                else:
                    out.append(value(depth + 1))
                while pos < len(text) and text[pos] == " ":
                    pos += 1
                if pos < len(text) and text[pos] == ",":
                    pos += 1
                elif pos < len(text) and text[pos] == close:
                    continue
                else:
                    raise ConfigError(f"{where}: unterminated flow collection near {text[pos:pos + 30]!r}")
        return atom(",]}")

    def atom(stops):
        nonlocal pos
        start = pos
        if pos < len(text) and text[pos] in "'\"":
            q = text[pos]
            pos += 1
            while pos < len(text):
                if text[pos] == q and not (q == "'" and text[pos + 1:pos + 2] == "'"):
                    break
                pos += 2 if (q == "'" and text[pos:pos + 2] == "''") or (q == '"' and text[pos] == "\\") else 1
            pos += 1
            return _scalar(text[start:pos], where)
        while pos < len(text) and text[pos] not in stops and not (text[pos] == ":" and ":" in stops):
            pos += 1
        return _scalar(text[start:pos], where)

    v = value()
    if text[pos:].strip():
        raise ConfigError(f"{where}: unexpected {text[pos:pos + 30]!r} after a flow collection")
    return v


def _split_key(line: str, where: str):
    """(key, the rest) of a ``key: value`` line, in one pass over it (a regular expression with a
    lazy key before ``\\s*:`` backtracked quadratically on a long line without a colon)."""
    end = _key_end(line)
    colon = end
    while colon < len(line) and line[colon].isspace():
        colon += 1
    if end == 0 or colon >= len(line) or line[colon] != ":" or \
            (colon + 1 < len(line) and not line[colon + 1].isspace()):
        raise ConfigError(f"{where}: line {line.strip()[:60]!r} is not in the YAML subset bert_of reads "
                          f"(key: value); give the config as JSON")
    return _scalar(line[:end], where), line[colon + 1:].lstrip()


def _key_end(line: str) -> int:
    """Where a mapping key that starts ``line`` ends: after its closing quote, or before the first
    ":" (a plain key holds no ":" or "#"; its trailing blanks are not part of it); 0 when there is none."""
    if not line:
        return 0
    q = line[0]
    if q in "'\"":
        i = 1
        while i < len(line):
            if q == "'" and line[i] == "'":
                if line[i + 1:i + 2] == "'":
                    i += 2
                    continue
                return i + 1
            if q == '"' and line[i] == "\\":
                i += 2
                continue
            if q == '"' and line[i] == '"':
                return i + 1
            i += 1
        return 0
    if q in ":#":
        return 0
    colon = line.find(":")
    if colon < 0 or "#" in line[:colon]:
        return 0
    return len(line[:colon].rstrip())


def parse_yaml(text: str, where: str) -> dict:
    """The YAML subset yaml.dump writes for a LiBai config (see the module doc) -> dict."""
    lines = []
    for raw in text.splitlines():
        if raw.strip() in ("", "---") or raw.lstrip().startswith("#"):
            continue
        if "\t" in raw[:len(raw) - len(raw.lstrip())]:
            raise ConfigError(f"{where}: tab indentation is not YAML")
        lines.append((len(raw) - len(raw.lstrip(" ")), raw.strip()))
    pos = 0

    def block(indent):
        nonlocal pos
        if pos < len(lines) and lines[pos][1].startswith("- ") or (pos < len(lines) and lines[pos][1] == "-"):
            out = []
            ind = lines[pos][0]
            while pos < len(lines) and lines[pos][0] == ind and (lines[pos][1].startswith("- ") or lines[pos][1] == "-"):
                item = lines[pos][1][1:].strip()
                pos += 1
                if not item:
                    out.append(block(ind + 1) if pos < len(lines) and lines[pos][0] > ind else None)
                elif re.match(r"^[^'\"{\[][^:]*:(\s|$)", item):  # "- key: value" starts a mapping
                    lines.insert(pos, (ind + 2, item))
                    out.append(block(ind + 2))
                else:
                    out.append(_value(item))
            return out
        out = {}
        ind = lines[pos][0] if pos < len(lines) else indent
        while pos < len(lines) and lines[pos][0] == ind:
            key, rest = _split_key(lines[pos][1], where)
            pos += 1
            if rest.strip():
                out[key] = _value(rest)
            elif pos < len(lines) and (lines[pos][0] > ind or lines[pos][1].startswith("-")):
                out[key] = block(lines[pos][0])
            else:
                out[key] = None
        if pos < len(lines) and lines[pos][0] > ind:
            raise ConfigError(f"{where}: unexpected indentation at {lines[pos][1][:60]!r}")
        return out

    def _value(rest):
        rest = rest.strip()
        if rest.startswith(("{", "[")):
            return _flow(rest, where)
        return _scalar(rest, where)

    if not lines:
        return {}
    doc = block(lines[0][0])
    if pos != len(lines):
        raise ConfigError(f"{where}: could not read line {lines[pos][1][:60]!r} (YAML subset)")
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: not a mapping")
    return doc


def read_config_file(path: str) -> dict:
    """A JSON or YAML (by its name) config file as a dict."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: config file not found")
    if path.endswith((".yaml", ".yml")):
        raw = read_bounded(path, _MAX_CONFIG, "config file", ConfigError)  # a regular file, size checked first
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: cannot read ({e})") from None
        return parse_yaml(text, path)
    return read_json(path, "config file", ConfigError)


# --------------------------------------------------------------------------- which config, what it says


def find_config(path: str, override=None, real=lambda p: p):
    """The config file of the flow.save folder ``path``: ``override``, a LiBai run's config.yaml, a
    config.json / bert_config.json in or beside it; None when there is none. ``real(p)``: the path
    that reads ``p`` (bert_of.files.pinned.PinnedDir.real)."""
    if override:
        if not os.path.isfile(real(override)):
            raise ConfigError(f"{override}: config file not found")
        return override
    here = os.path.abspath(path)
    parent = os.path.dirname(here)
    for d in (here, parent):
        for name in CONFIG_NAMES + (LIBAI_RUN_CONFIG,):
            p = os.path.join(d, name)
            if os.path.isfile(real(p)):
                return p
    p = os.path.join(os.path.dirname(parent), LIBAI_RUN_CONFIG)  # output_dir/model_final/model/
    if os.path.basename(parent).startswith("model_") and os.path.isfile(real(p)):
        return p
    return None


def kind_of(d: dict) -> str:
    """"libai" | "ofmodels" | "bert_of" | "hf" | "google" for a config dict (LiBai's run config is
    reduced to its model.cfg first, see :func:`model_cfg`)."""
    if "provenance" in d:
        return "bert_of"
    if "atten_heads" in d or "seq_length" in d:
        return "ofmodels"
    if "hidden_layers" in d or "num_tokentypes" in d or "layernorm_eps" in d or \
            "apply_residual_post_layernorm" in d:
        return "libai"
    if "model_type" in d or "architectures" in d or "layer_norm_eps" in d and "hidden_act" in d and \
            d.get("hidden_act") != "gelu":
        return "hf"
    return "google"


def model_cfg(d: dict, where: str) -> dict:
    """LiBai's run config -> its ``model.cfg``; any other config as it is."""
    model = d.get("model")
    if isinstance(model, dict) and "cfg" in model:
        cfg = model["cfg"]
        if not isinstance(cfg, dict):
            raise ConfigError(f"{where}: model.cfg is not a mapping")
        return cfg
    if "train" in d and "model" not in d:
        raise ConfigError(f"{where}: a LiBai run config without model.cfg")
    return d


def _ints(d, keys, where):
    for k in keys:
        v = d.get(k)
        if isinstance(v, float) and v.is_integer():
            d[k] = int(v)


def libai_config(cfg: dict, where: str) -> BertConfig:
    """LiBai's ``model.cfg`` keys -> BertConfig with LiBai's numerics: erf GELU, its eps, the
    LayerNorm placement of ``apply_residual_post_layernorm``, query-key layer scaling, the MLM head's
    LayerNorm at eps 1e-5."""
    d = {**LIBAI_DEFAULTS, **cfg}
    missing = [k for k in ("vocab_size", "hidden_size", "hidden_layers", "num_attention_heads", "intermediate_size",
                           "max_position_embeddings") if k not in d]
    if missing:
        raise ConfigError(f"{where}: LiBai config lacks {', '.join(missing)}")
    for k in ("apply_residual_post_layernorm", "apply_query_key_layer_scaling"):
        if not isinstance(d[k], bool):
            raise ConfigError(f"{where}: {k} must be true or false, got {d[k]!r}")
    if d["num_tokentypes"] in (0, None):
        raise ConfigError(f"{where}: num_tokentypes 0 (no token type embeddings): bert_of's BERT has them")
    _ints(d, [k for k, f in LIBAI_KEYS.items()], where)
    kw = {f: d[k] for k, f in LIBAI_KEYS.items() if k in d}
    extra = {k: v for k, v in cfg.items() if k not in LIBAI_KEYS and k not in
             ("apply_residual_post_layernorm", "apply_query_key_layer_scaling")}
    try:
        return BertConfig(hidden_act="gelu_erf", provenance="libai",
                          layernorm_placement="post" if d["apply_residual_post_layernorm"] else "pre",
                          query_key_layer_scaling=d["apply_query_key_layer_scaling"],
                          head_layer_norm_eps=LIBAI_HEAD_LN_EPS, extra={"libai": extra} if extra else {}, **kw)
    except (TypeError, ConfigError) as e:
        raise ConfigError(f"{where}: {str(e).removeprefix('config: ')}") from None


def libai_cfg_of(config: BertConfig) -> dict:
    """BertConfig -> LiBai's model.cfg keys (what LiBai's BertModel / BertForPreTraining take)."""
    d = {k: getattr(config, f) for k, f in LIBAI_KEYS.items() if f != "num_labels"}
    extra = config.extra.get("libai") if isinstance(config.extra.get("libai"), dict) else {}
    d.update({"add_pooling_layer": True, "bias_gelu_fusion": True, "bias_dropout_fusion": True,
              "scale_mask_softmax_fusion": True, "add_binary_head": True, "amp_enabled": False})
    d.update(extra)
    d["apply_residual_post_layernorm"] = not config.pre_ln
    d["apply_query_key_layer_scaling"] = config.query_key_layer_scaling
    if config.num_labels != 2 or "num_labels" in extra:
        d["num_labels"] = config.num_labels
    return dict(sorted(d.items()))


def ofmodels_config(d: dict, where: str) -> BertConfig:
    """The models repo's BertForPreTraining arguments -> BertConfig: nn.GELU (erf), nn.LayerNorm eps 1e-5."""
    d = {**OFMODELS_DEFAULTS, **d}
    missing = [k for k in ("vocab_size", "hidden_size", "hidden_layers", "atten_heads", "intermediate_size") if k not in d]
    if missing:
        raise ConfigError(f"{where}: Oneflow-Inc/models BERT arguments lack {', '.join(missing)}")
    _ints(d, list(OFMODELS_KEYS), where)
    kw = {f: d[k] for k, f in OFMODELS_KEYS.items()}
    extra = {k: v for k, v in d.items() if k not in OFMODELS_KEYS and k != "hidden_act"}
    act = d.get("hidden_act", "gelu")
    if act not in ("gelu", "nn.GELU()", "GELU", None):
        raise ConfigError(f"{where}: hidden_act {act!r}: the models repo's BERT is built with nn.GELU() (erf)")
    eps = d.get("layer_norm_eps", OFMODELS_LN_EPS)  # the repo never sets one; a config that says so wins
    extra.pop("layer_norm_eps", None)
    try:
        return BertConfig(hidden_act="gelu_erf", layer_norm_eps=eps, provenance="oneflow",
                          extra={"ofmodels": extra} if extra else {}, **kw)
    except (TypeError, ConfigError) as e:
        raise ConfigError(f"{where}: {str(e).removeprefix('config: ')}") from None


def ofmodels_args_of(config: BertConfig) -> dict:
    d = {k: getattr(config, f) for k, f in OFMODELS_KEYS.items()}
    extra = config.extra.get("ofmodels") if isinstance(config.extra.get("ofmodels"), dict) else {}
    d["seq_length"] = config.max_position_embeddings
    d.update(extra)
    d["hidden_act"] = "gelu"
    return dict(sorted(d.items()))


def load_config(path: str, override, fmt: str, real=lambda p: p):
    """(BertConfig, config file) for the flow.save folder ``path`` read as format ``fmt``
    ("ofsd" | "ofmodels" | "libai"); ConfigError naming what is missing. ``real(p)``: the path that
    reads ``p`` (bert_of.files.pinned.PinnedDir.real)."""
    where = find_config(path, override, real)
    if where is None:
        raise ConfigError(f"{path}: no config in or beside this flow.save folder (config.json, bert_config.json, "
                          f"a LiBai run's config.yaml): pass --config")
    raw = model_cfg(read_config_file(real(where)), where)
    kind = kind_of(raw)
    if fmt == "libai" and kind != "libai" and kind != "bert_of":
        raise ConfigError(f"{where}: a LiBai checkpoint's LayerNorm placement is in its LiBai config "
                          f"(apply_residual_post_layernorm): pass its config.yaml or a JSON with LiBai's keys")
    if kind == "bert_of":
        return BertConfig.from_dict(raw, where), where
    if kind == "libai":
        return libai_config(raw, where), where
    if kind == "ofmodels":
        return ofmodels_config(raw, where), where
    config = config_from_hf(raw, where) if kind == "hf" else BertConfig.from_google_dict(raw, where)
    if fmt == "ofmodels":  # numerics by provenance: the models repo computes erf GELU, eps 1e-5
        config.hidden_act, config.layer_norm_eps, config.provenance = "gelu_erf", OFMODELS_LN_EPS, "oneflow"
    return config, where
