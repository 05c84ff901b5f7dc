"""The project's shape, checked from its source: layers, no import cycles, imports at the top.

Layers, bottom to top (docs/architecture.md); a module may import its own layer or any below:

    0 base      errors, version, process, files/, native, oneflow_fix, blas, config, initializers, checkpoint, tokenization, vocab, protobuf
    1 model     _flow, kernels, train_kernels, update_kernels, model_io, modeling, heads
    2 formats   converters/ (bert_of.converters): readers, writers, verification
    3 training  bert_of/data/, the trainer, the rank launcher
    4 services  zoo/ (bert_of.zoo), eval/ (bert_of.eval), pretraining/ and finetuning/ (the runs)
    5 commands  the CLI, every cli.py (pretraining/, finetuning/ too), align, the package facade
"""

import ast
import os
import re

import pytest

from tests.conftest import ROOT

# package folder -> import name (the installed distribution claims only `bert_of`)
PACKAGES = {"bert_of": "bert_of", "converters": "bert_of.converters", "zoo": "bert_of.zoo", "eval": "bert_of.eval"}

# (regex over the module name, layer); first match wins
LAYERS = [
    (r"bert_of\.(errors|version|runtime|runtime\.(process|native|oneflow_fix|blas)|files(\.\w+)?|resolver|progress|config|options|tensors|initializers|checkpoint|tokenization|vocab|protobuf|pickles)", 0),
    (r"bert_of\.(_flow|runtime\.(kernels|train_kernels|update_kernels|flow_import)|inputs|outputs|model_io|modeling|heads|tokenizer)", 1),
    (r"bert_of\.(converters|zoo|eval|data|pretraining|finetuning)(\.\w+)*\.(\w*cli|__main__)", 5),
    (r"bert_of\.converters(\..+)?", 2),
    (r"bert_of\.data(\..+)?|bert_of\.(training|launch)(\..+)?", 3),
    (r"bert_of\.(zoo|eval|pretraining|finetuning)(\..+)?", 4),
    (r"bert_of|bert_of\.(__main__|cli|cli_grammar|plots|finetune|align|commands|selftest)(\..+)?", 5),
]
NAMES = {0: "base", 1: "model", 2: "formats", 3: "training", 4: "services", 5: "commands"}


def _modules() -> dict:
    """{module name: source path} of the library (tests, bench and scripts are not part of it)."""
    out = {}
    for folder, name in PACKAGES.items():
        base = os.path.join(ROOT, folder)
        for d, dirs, files in os.walk(base):
            dirs[:] = [x for x in dirs if not x.startswith((".", "__"))]
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), base)[:-3].replace(os.sep, ".")
                    mod = name if rel == "__init__" else f"{name}.{rel[:-len('.__init__')]}" \
                        if rel.endswith(".__init__") else f"{name}.{rel}"
                    out[mod] = os.path.join(d, f)
    return out


MODULES = _modules()


def layer(mod: str) -> int:
    for rx, n in LAYERS:
        if re.fullmatch(rx, mod):
            return n
    raise AssertionError(f"{mod}: no layer assigned (add it to LAYERS and docs/architecture.md)")


def _resolve(name: str):
    """The library module an imported name refers to (longest existing prefix), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod: str, path: str):
    """[(target module, inside a function?)] for every import statement naming library modules."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    in_func = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
               for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = mod.split(".")
                pkg = pkg[:len(pkg) - node.level + (1 if path.endswith("__init__.py") else 0)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        # `from bert_of.x import y`: y is a submodule if it is one, else a name in bert_of.x
        targets = set()
        for n in names:
            if n.split(".")[0] in ("bert_of", "converters", "zoo", "eval") and not n.startswith("bert_of"):
                targets.add(("<unprefixed>", n))
                continue
            t = _resolve(n)
            if t and t != mod:
                targets.add(t)
        if isinstance(node, ast.ImportFrom) and len(targets) > 1:
            targets.discard(_resolve(names[0]))  # `from pkg import sub`: the edge is to sub
        for t in targets:
            out.append((t, id(node) in in_func, node.lineno))
    return out


EDGES = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    for m in MODULES:
        layer(m)


def test_library_imports_only_the_bert_of_namespace():
    bad = [f"{m}:{line}: import {t[1]}" for m, es in EDGES.items() for t, _, line in es if isinstance(t, tuple)]
    assert not bad, "import converters/zoo/eval as bert_of.converters/... :\n" + "\n".join(bad)


def test_layers_import_only_downwards():
    bad = []
    for m, es in EDGES.items():
        for t, _, line in es:
            if isinstance(t, str) and layer(t) > layer(m):
                bad.append(f"{MODULES[m]}:{line}: {m} ({NAMES[layer(m)]}) imports {t} ({NAMES[layer(t)]})")
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_base_and_model_import_no_formats_zoo_eval_or_cli():
    bad = [f"{m} -> {t}" for m, es in EDGES.items() if layer(m) <= 1 for t, _, _ in es
           if isinstance(t, str) and re.match(r"bert_of\.(converters|zoo|eval|cli|pretrain|finetuning|align)", t)]
    assert not bad, bad


def test_no_import_cycles():
    adj = {m: sorted({t for t, _, _ in es if isinstance(t, str)}) for m, es in EDGES.items()}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in adj:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_imports_sit_at_module_top():
    """At most 15% of internal imports inside functions (optional heavy dependencies aside)."""
    statements = {(m, line): f for m, es in EDGES.items() for _, f, line in es}  # one per import statement
    inner = sorted(f"{MODULES[m]}:{line}" for (m, line), f in statements.items() if f)
    share = len(inner) / max(len(statements), 1)
    assert share <= 0.15, f"{len(inner)}/{len(statements)} internal imports inside functions ({share:.0%}):\n" + \
        "\n".join(inner)


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if layer(m) == 0))
def test_base_layer_imports_no_oneflow_or_tensorflow(mod):
    src = open(MODULES[mod], encoding="utf-8").read()
    assert not re.search(r"^\s*(import|from)\s+(oneflow|tensorflow)\b", src, re.M), mod


def _environ_writes(path: str) -> list:
    """Lines of ``path`` that change os.environ: item assignment or deletion, its mutating methods,
    os.putenv / os.unsetenv."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)

    def is_environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ" or \
            isinstance(node, ast.Name) and node.id == "environ"

    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Subscript) and is_environ(t.value) for t in targets):
            out.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if is_environ(f.value) and f.attr in ("pop", "popitem", "update", "setdefault", "clear", "__setitem__",
                                                  "__delitem__") or f.attr in ("putenv", "unsetenv"):
                out.append(node.lineno)
    return out


def test_only_the_process_module_writes_the_environment():
    """OneFlow's worker threads call getenv for every kernel; a setenv of a new name under them is a
    segfault. bert_of.runtime.process.set_environ drains OneFlow before it writes: no other module writes."""
    writes = {m: lines for m, p in MODULES.items() if m != "bert_of.runtime.process" and (lines := _environ_writes(p))}
    assert writes == {}, writes


def test_library_modules_import_modules_not_the_package_facade():
    """``from bert_of import X`` runs the facade (bert_of/__init__.py), which reaches the zoo lazily:
    counted as an edge, it closes a cycle (shared/tools/import_graph.py). Modules name the module."""
    found = []
    for mod, path in MODULES.items():
        if mod == "bert_of":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "bert_of":
                found.append(f"{path}:{node.lineno}")
    assert found == [], found


def test_the_model_layer_reaches_oneflows_workarounds_only_through_flow():
    """bert_of/runtime/ (OneFlow 0.9's workarounds) is quarantined: the model layer's modules import
    it only through bert_of/_flow.py, so they read as maths."""
    bad = [f"{MODULES[m]}:{line}: imports {t}" for m, es in EDGES.items()
           if layer(m) == 1 and m != "bert_of._flow" and not m.startswith("bert_of.runtime")
           for t, _, line in es if isinstance(t, str) and t.startswith("bert_of.runtime")]
    assert not bad, "\n".join(bad)


def test_native_sources_and_their_headers_ship_as_package_data():
    """bert_of/runtime/native.py compiles the .c files on the user's machine: an installed wheel needs
    each of them and every header they include from the same folder (gelu_vec.h), listed in pyproject's
    package data."""
    runtime = os.path.join(ROOT, "bert_of", "runtime")
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        listed = re.search(r'^"bert_of\.runtime" = \[(.*)\]$', f.read(), re.M)
    assert listed, "pyproject.toml lists no package data for bert_of.runtime"
    shipped = set(re.findall(r'"([^"]+)"', listed.group(1)))
    sources = {n for n in os.listdir(runtime) if n.endswith(".c")}
    headers = set()
    for name in sources:
        with open(os.path.join(runtime, name)) as f:
            headers |= set(re.findall(r'^\s*#\s*include\s+"([^"/]+)"', f.read(), re.M))
    assert "gelu_vec.h" in headers and headers <= set(os.listdir(runtime))
    assert sources | headers <= shipped, sorted(sources | headers - shipped)


def test_autograd_functions_read_no_attribute_of_ctx():
    """OneFlow 0.9's FunctionCtx returns an attribute set on it as a borrowed reference: each
    ``ctx.name`` read frees what ctx still holds, and a late ctx death then corrupts the heap
    (bert_of/runtime/train_kernels.py's docstring). A Function's forward and backward (functions of
    those names whose first parameter is ``ctx``) may set one, but read only ctx's tensor API
    (train_kernels._saved reads the rest)."""
    allowed = {"save_for_backward", "saved_tensors", "mark_non_differentiable"}
    bad = []
    for path in MODULES.values():
        for f in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if (isinstance(f, ast.FunctionDef) and f.name in ("forward", "backward") and f.args.args
                    and f.args.args[0].arg == "ctx"):
                bad += [f"{path}:{n.lineno}: ctx.{n.attr}" for n in ast.walk(f) if isinstance(n, ast.Attribute)
                        and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name) and n.value.id == "ctx"
                        and n.attr not in allowed]
    assert not bad, "\n".join(bad)
