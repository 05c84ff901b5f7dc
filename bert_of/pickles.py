"""Pickles parsed as data: the one safe pickle reader (flow.save's pickled_data, torch.save's data.pkl).

:func:`parse` walks a pickle's opcodes itself; it never calls :mod:`pickle`, never looks a name up and
never runs anything. A caller says what its format may contain:

- ``globals``: {(module, name): value}: the value stands for the global (any other global is
  refused by name: :class:`Refused` "global module.name");
- ``reduce(fn, args)``, ``newobj(cls, args)``, ``build(obj, state)``, ``persistent(pid)``: what those
  opcodes make of the caller's values (each may raise :class:`Refused`); unset, the opcode is refused.
  An object that BUILD replaces is replaced in the memo too (later GETs see the built object).

Everything else is plain data: None, bools, ints (at most 64 bits), floats, str, bytes, tuples,
lists and dicts. Bounds, in proportion to the input: every opcode consumes at least one byte and does
work linear in what it consumes or pops (so time and memory are O(input)); marks nest at most
:data:`MAX_DEPTH` deep; integers and strings are as long as their bytes. Shared references (memo
GETs) can make a small pickle name a huge tree: :func:`plain` walks a result with a budget of visits
in proportion to the input's size and refuses cycles.
"""

from __future__ import annotations

import struct
from typing import Callable, Optional

MAX_DEPTH = 64
# Work and memory bounded by the input, not only by its size: a checkpoint's pickle makes an object
# (string, number, container, record, memo entry) per ~10-30 bytes, so at most one per
# BYTES_PER_OBJECT bytes (+ a few) and never more than MAX_OBJECTS; the stack holds a SETITEMS batch
# (1000 pairs) at most. A hostile pickle of empty dicts or memo entries is refused after bounded work.
BYTES_PER_OBJECT = 4
MAX_OBJECTS = 1 << 20
MAX_STACK = 1 << 14


class Refused(Exception):
    """What the pickle holds that its format does not admit (one line, naming it)."""


class _Mark:
    pass


_MARK = _Mark()


def _refuse(opcode):
    def op(x, *_):
        raise Refused(f"{opcode} of {show(x)}")
    return op


def show(x) -> str:
    """A short, safe description of a parsed value for a message."""
    if isinstance(x, (str, int, float, bool)) or x is None:
        return repr(x)[:60]
    return getattr(x, "shown", None) or type(x).__name__


class _Parser:
    def __init__(self, raw: bytes, globals_: dict, reduce, newobj, build, persistent, protocols):
        self.raw, self.pos = raw, 0
        self.stack, self.marks, self.memo, self.memo_of = [], [], {}, {}
        self.globals, self.protocols = globals_, protocols
        self.reduce = reduce or _refuse("REDUCE")
        self.newobj = newobj or _refuse("NEWOBJ")
        self.build = build or _refuse("BUILD")
        self.persistent = persistent or _refuse("a persistent id")
        self.budget = min(MAX_OBJECTS, 64 + len(raw) // BYTES_PER_OBJECT)  # objects it may still make

    def made(self, obj=None):
        """One more object (or memo entry) made; refused past what a checkpoint's pickle of this size makes."""
        self.budget -= 1
        if self.budget < 0:
            raise Refused(f"more objects than a state dict's pickle of {len(self.raw)} bytes makes "
                          f"(at byte {self.pos})")
        return obj

    def push(self, obj):
        if len(self.stack) >= MAX_STACK:
            raise Refused(f"malformed stream (a stack over {MAX_STACK} deep at byte {self.pos})")
        self.stack.append(obj)

    def read(self, n):
        if self.pos + n > len(self.raw):
            raise Refused(f"truncated stream (ends inside an opcode at byte {len(self.raw)})")
        b = self.raw[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def pop(self):
        if not self.stack or self.stack[-1] is _MARK:
            raise Refused(f"malformed stream (stack underflow at byte {self.pos})")
        return self.stack.pop()

    def top(self):
        if not self.stack or self.stack[-1] is _MARK:
            raise Refused(f"malformed stream (nothing on the stack at byte {self.pos})")
        return self.stack[-1]

    def pop_mark(self):
        if not self.marks:
            raise Refused(f"malformed stream (no MARK at byte {self.pos})")
        m = self.marks.pop()
        items = self.stack[m + 1:]
        del self.stack[m:]
        return items

    def text(self, b):
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused("a string that is not UTF-8") from None

    def line(self):
        end = self.raw.find(b"\n", self.pos, self.pos + 256)
        if end < 0:
            raise Refused("truncated stream (GLOBAL without its newline)")
        s = self.text(self.raw[self.pos:end])
        self.pos = end + 1
        return s

    def global_(self, module, name):
        if (module, name) not in self.globals:
            raise Refused(f"global {str(module)[:60]}.{str(name)[:60]}")
        return self.globals[(module, name)]

    def put(self, i, obj):
        self.made()
        self.memo[i] = obj
        self.memo_of.setdefault(id(obj), []).append(i)

    def setitems(self, d, items):
        if not isinstance(d, dict):
            raise Refused(f"SETITEM(S) on {show(d)}")
        if len(items) % 2:
            raise Refused("malformed stream (odd SETITEMS)")
        for k, v in zip(items[::2], items[1::2]):
            if type(k) not in (str, int, bytes, tuple, bool, float) and k is not None:
                raise Refused(f"dict key {show(k)}")
            if type(k) is tuple and not all(type(x) in (str, int) for x in k):
                raise Refused("dict key of a tuple holding objects")
            d[k] = v

    def appends(self, lst, items):
        if not isinstance(lst, list):
            raise Refused(f"APPEND(S) on {show(lst)}")
        lst.extend(items)

    def run(self):
        while True:
            op = self.read(1)
            at = self.pos - 1
            st = self.stack
            if op == b"\x80":  # PROTO
                v = self.read(1)[0]
                if v not in self.protocols:
                    raise Refused(f"pickle protocol {v} (this format writes {min(self.protocols)}-{max(self.protocols)})")
            elif op == b"\x95":  # FRAME: a length prefix only
                self.read(8)
            elif op == b".":  # STOP
                if len(st) != 1 or self.marks:
                    raise Refused("malformed stream (STOP with more than one object)")
                if self.pos != len(self.raw):
                    raise Refused(f"{len(self.raw) - self.pos} bytes after STOP")
                return st[0]
            elif op == b"}":  # EMPTY_DICT
                self.push(self.made({}))
            elif op == b"]":  # EMPTY_LIST
                self.push(self.made([]))
            elif op == b")":  # EMPTY_TUPLE
                self.push(())
            elif op == b"(":  # MARK
                self.marks.append(len(st))
                self.push(_MARK)
                if len(self.marks) > MAX_DEPTH:
                    raise Refused("malformed stream (too deeply nested)")
            elif op in (b"\x85", b"\x86", b"\x87"):  # TUPLE1-3
                n = op[0] - 0x84
                self.push(self.made(tuple([self.pop() for _ in range(n)][::-1])))
            elif op == b"t":  # TUPLE
                self.push(self.made(tuple(self.pop_mark())))
            elif op == b"l":  # LIST
                self.push(self.made(self.pop_mark()))
            elif op == b"d":  # DICT
                d = {}
                self.setitems(d, self.pop_mark())
                self.push(self.made(d))
            elif op == b"\x8c":  # SHORT_BINUNICODE
                self.push(self.made(self.text(self.read(self.read(1)[0]))))
            elif op == b"X":  # BINUNICODE
                self.push(self.made(self.text(self.read(self.unpack("<I")))))
            elif op == b"C":  # SHORT_BINBYTES
                self.push(self.made(self.read(self.read(1)[0])))
            elif op == b"B":  # BINBYTES
                self.push(self.made(self.read(self.unpack("<I"))))
            elif op == b"K":  # BININT1
                self.push(self.read(1)[0])
            elif op == b"M":  # BININT2
                self.push(self.made(self.unpack("<H")))
            elif op == b"J":  # BININT
                self.push(self.made(self.unpack("<i")))
            elif op == b"\x8a":  # LONG1: at most 8 bytes here
                n = self.read(1)[0]
                if n > 8:
                    raise Refused(f"an integer of {n} bytes")
                self.push(self.made(int.from_bytes(self.read(n), "little", signed=True)))
            elif op == b"G":  # BINFLOAT
                self.push(self.made(self.unpack(">d")))
            elif op == b"N":  # NONE
                self.push(None)
            elif op in (b"\x88", b"\x89"):  # NEWTRUE / NEWFALSE
                self.push(op == b"\x88")
            elif op == b"\x94":  # MEMOIZE
                self.put(len(self.memo), self.top())
            elif op in (b"q", b"r"):  # BINPUT / LONG_BINPUT
                i = self.read(1)[0] if op == b"q" else self.unpack("<I")
                self.put(i, self.top())
            elif op in (b"h", b"j"):  # BINGET / LONG_BINGET
                i = self.read(1)[0] if op == b"h" else self.unpack("<I")
                if i not in self.memo:
                    raise Refused(f"malformed stream (memo {i} unset)")
                self.push(self.memo[i])
            elif op == b"\x93":  # STACK_GLOBAL
                name = self.pop()
                module = self.pop()
                if type(module) is not str or type(name) is not str:
                    raise Refused("malformed stream (STACK_GLOBAL of non-strings)")
                self.push(self.made(self.global_(module, name)))
            elif op == b"c":  # GLOBAL (protocol 2): "module\nname\n"
                module = self.line()
                self.push(self.made(self.global_(module, self.line())))
            elif op == b"Q":  # BINPERSID
                self.push(self.made(self.persistent(self.pop())))
            elif op == b"R":  # REDUCE
                args = self.pop()
                fn = self.pop()
                if type(args) is not tuple:
                    raise Refused(f"REDUCE with arguments {show(args)}")
                self.push(self.made(self.reduce(fn, args)))
            elif op == b"\x81":  # NEWOBJ
                args = self.pop()
                cls = self.pop()
                self.push(self.made(self.newobj(cls, args)))
            elif op == b"b":  # BUILD
                state = self.pop()
                obj = self.pop()
                built = self.build(obj, state)
                if built is not obj:  # later GETs see the built object
                    for i in self.memo_of.pop(id(obj), ()):
                        if self.memo.get(i) is obj:
                            self.put(i, built)
                self.push(self.made(built))
            elif op == b"s":  # SETITEM
                v = self.pop()
                k = self.pop()
                self.setitems(self.top(), [k, v])
            elif op == b"u":  # SETITEMS
                items = self.pop_mark()
                self.setitems(self.top(), items)
            elif op == b"a":  # APPEND
                v = self.pop()
                self.appends(self.top(), [v])
            elif op == b"e":  # APPENDS
                items = self.pop_mark()
                self.appends(self.top(), items)
            else:
                raise Refused(f"pickle opcode {op!r} at byte {at}")


def parse(raw: bytes, globals_: Optional[dict] = None, *, reduce: Optional[Callable] = None,
          newobj: Optional[Callable] = None, build: Optional[Callable] = None,
          persistent: Optional[Callable] = None, protocols=(2, 3, 4, 5)):
    """The object ``raw`` pickles, built from data only (see the module doc); :class:`Refused`
    otherwise."""
    return _Parser(raw, globals_ or {}, reduce, newobj, build, persistent, protocols).run()


def plain(obj, budget: int, leaf: Callable = lambda x: False):
    """Check ``obj`` (what :func:`parse` made) is a tree of at most ``budget`` nodes without
    cycles (shared references count each time they are reached), and return it. ``leaf(x)``: an
    object of the caller's, not walked into."""
    seen = 0
    stack = [(obj, ())]
    while stack:
        x, path = stack.pop()
        seen += 1
        if seen > budget:
            raise Refused(f"it expands to more than {budget} objects (shared references)")
        if leaf(x) or not isinstance(x, (list, tuple, dict)):
            continue
        if any(x is p for p in path):
            raise Refused("a container that holds itself")
        if len(path) > MAX_DEPTH * 4:
            raise Refused("too deeply nested")
        children = list(x.keys()) + list(x.values()) if isinstance(x, dict) else list(x)
        stack.extend((c, path + (x,)) for c in children)
    return obj


__all__ = ["Refused", "parse", "plain", "show", "MAX_DEPTH"]
