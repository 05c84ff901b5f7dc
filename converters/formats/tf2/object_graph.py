"""TensorFlow's object graphs, read and written: which variable a TF2 checkpoint or SavedModel key is.

- ``TrackableObjectGraph`` (object_graph.proto; a checkpoint's ``_CHECKPOINTABLE_OBJECT_GRAPH``):
  parsed into :class:`Node`s, every path from the root to a node (:func:`aliases`), the key TF gives
  each node (:func:`keys_of`: the first path of its breadth-first walk), built
  (:class:`GraphBuilder`) and encoded for a writer.
- ``SavedObjectGraph`` (``saved_model.pb``): each variable node's name (:func:`saved_variable_names`).

Protobuf as data through bert_of.protobuf; bounded (``MAX_GRAPH`` bytes, ``MAX_PATHS`` walk steps).
What the names mean for BERT (Model Garden's tables) is converters/formats/tf2/'s.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

import bert_of.protobuf as pb
from bert_of.errors import CheckpointError

MAX_GRAPH = 1 << 31  # protobuf's own limit on a message: saved_model.pb is read whole, no larger
MAX_PATHS = 200_000  # object-graph walk steps: a hostile graph (every node a child of every other) stops here
MAX_PATH_CHARS = 1 << 24  # the variables' paths spelled out, in all (a BERT-large checkpoint's: ~10^5)


@dataclass
class Node:
    """One TrackableObjectGraph.TrackableObject: named children, its tensors (name, full name,
    checkpoint key) and, on an optimizer, its slot variables (variable node, slot name, slot node)."""

    children: list = field(default_factory=list)
    attributes: list = field(default_factory=list)
    slots: list = field(default_factory=list)


def _text(b) -> str:
    return bytes(b).decode("utf-8", "surrogateescape")


def parse_object_graph(buf: bytes) -> list:
    """A serialized TrackableObjectGraph (object_graph.proto: nodes = 1; children = 1 {node_id 1,
    local_name 2}, attributes = 2 {name 1, full_name 2, checkpoint_key 3}, slot_variables = 3
    {original_variable_node_id 1, slot_name 2, slot_variable_node_id 3}) as Nodes."""
    nodes = []
    for num, wt, v in pb.values(buf):
        if num != 1 or wt != 2:
            continue
        node = Node()
        for n, w, x in pb.values(v):
            if w != 2 or n not in (1, 2, 3):
                continue
            ints, strs = {}, {}
            for k, wt, val in pb.values(x):
                (ints if wt == 0 else strs if wt == 2 else {})[k] = val
            if n == 1:
                node.children.append((ints.get(1, 0), _text(strs.get(2, b""))))
            elif n == 2:
                node.attributes.append((_text(strs.get(1, b"")), _text(strs.get(2, b"")), _text(strs.get(3, b""))))
            else:
                node.slots.append((ints.get(1, 0), _text(strs.get(2, b"")), ints.get(3, 0)))
        nodes.append(node)
    for node in nodes:
        for i, _ in node.children + [(s[0], "") for s in node.slots] + [(s[2], "") for s in node.slots]:
            if not 0 <= i < len(nodes):
                raise pb.ProtobufError(f"a reference to node {i} of {len(nodes)}")
    return nodes


def encode_object_graph(nodes: list) -> bytes:
    def obj(node):
        out = b"".join(pb.field_bytes(1, pb.field_varint(1, i) + pb.field_bytes(2, name.encode())) for i, name in node.children)
        out += b"".join(pb.field_bytes(2, pb.field_bytes(1, a.encode()) + pb.field_bytes(2, f.encode()) + pb.field_bytes(3, k.encode()))
                        for a, f, k in node.attributes)
        return out
    return b"".join(pb.field_bytes(1, obj(n)) for n in nodes)


def aliases(nodes: list, where: str) -> dict:
    """node id -> every path from the root to it (local names joined by "/"), skipping Keras's
    ``layer-N`` edges (each duplicates a ``layer_with_weights-N`` or holds no weights), for the
    nodes holding tensors (no other path is read). Linear in the walk: a path is a parent link
    per step, spelled out only for a node with tensors (at most MAX_PATH_CHARS in all), and the
    nodes on the current path are one set (entered and left), not a copy per step."""
    if not nodes:
        raise CheckpointError(f"{where}: the object graph has no nodes (not a checkpoint tf.train.Checkpoint wrote)")
    wanted = {i for i, node in enumerate(nodes) if node.attributes}
    out, steps, chars, on_path = {}, 0, 0, set()
    stack = [(0, None, True)]  # (node, path as (name, parent path) links, entering: else leaving)
    while stack:
        i, link, entering = stack.pop()
        if not entering:
            on_path.discard(i)
            continue
        if i in wanted:
            names, up = [], link
            while up is not None:
                names.append(up[0])
                up = up[1]
            path = "/".join(reversed(names))
            chars += len(path)
            if chars > MAX_PATH_CHARS:
                raise CheckpointError(f"{where}: the object graph's paths to its variables are longer than "
                                      f"{MAX_PATH_CHARS:,} characters in all (not a model's)")
            out.setdefault(i, []).append(path)
        on_path.add(i)
        stack.append((i, None, False))
        for child, name in reversed(nodes[i].children):
            steps += 1
            if steps > MAX_PATHS:
                raise CheckpointError(f"{where}: the object graph has more than {MAX_PATHS} paths (not a model's)")
            if child in on_path or re.fullmatch(r"layer-\d+", name):
                continue
            stack.append((child, (name, link), True))
    return out


def _escape(name: str) -> str:
    """A local name inside a checkpoint key, as TF escapes it."""
    return name.replace(".", "..").replace("/", ".S")


def keys_of(nodes: list) -> dict:
    """node id -> its checkpoint key: the first path of TF's breadth-first walk from the root."""
    keys, seen, queue = {}, {0}, deque([(0, "")])
    while queue:
        i, path = queue.popleft()
        keys[i] = path
        for child, name in nodes[i].children:
            if child not in seen:
                seen.add(child)
                queue.append((child, f"{path}/{_escape(name)}" if path else _escape(name)))
    return keys


def saved_variable_names(path: str) -> dict:
    """node id -> variable name from ``saved_model.pb`` (SavedModel.meta_graphs = 2;
    MetaGraphDef.object_graph_def = 7; SavedObjectGraph.nodes = 1; SavedObject.variable = 7;
    SavedVariable.name = 6). A malformed file is a CheckpointError naming it."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_GRAPH + 1)
        if len(data) > MAX_GRAPH:
            raise pb.ProtobufError(f"larger than {MAX_GRAPH} bytes")
        metas = [v for n, w, v in pb.values(data) if n == 2 and w == 2]
        if len(metas) != 1:
            raise pb.ProtobufError(f"{len(metas)} meta graphs (one expected)")
        graphs = [v for n, w, v in pb.values(metas[0]) if n == 7 and w == 2]
        if not graphs:
            raise pb.ProtobufError("no object graph (a TF1 SavedModel, not TF2's)")
        names = {}
        nodes = [v for n, w, v in pb.values(graphs[-1]) if n == 1 and w == 2]
        for i, node in enumerate(nodes):
            for n, w, v in pb.values(node):
                if n == 7 and w == 2:
                    names[i] = next((_text(x) for k, wt, x in pb.values(v) if k == 6 and wt == 2), "")
        return names
    except pb.ProtobufError as e:
        raise CheckpointError(f"{path}: not a readable SavedModel ({e})") from None


class GraphBuilder:
    """An object graph being built: nodes with named children; variables hold one tensor."""

    def __init__(self):
        self.nodes = [Node()]
        self.values = {}  # node -> (full name, producer)

    def child(self, parent: int, name: str, node: int | None = None) -> int:
        if node is None:
            self.nodes.append(Node())
            node = len(self.nodes) - 1
        self.nodes[parent].children.append((node, name))
        return node

    def var(self, parent: int, name: str, full_name: str, produce) -> int:
        node = self.child(parent, name)
        self.values[node] = (full_name, produce)
        return node
