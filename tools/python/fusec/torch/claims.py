"""fusec.torch.claims: which nodes of a graph fusec takes, and why not.

The backend's executor, in the manner of Thunder's: claim(gm, device)
walks the graph once with the exporter's writer (fusec.torch.writer) and
returns one Claim per node that computes something: claimed, or left to
PyTorch with the reason (no mapping, a refused use, a dtype fusec lacks, a
tensor on another device). A node that is not claimed becomes, for the
nodes after it, an opaque value of its dtype and shape, so each node is
judged on its own and one fallback does not drag its users along. Random
ops are claimed: they are written on a seed input (writer.Draws). The
claims are plain data: the backend partitions by them and explain()
prints them.

Not here: cutting the graph into parts, or writing or running a part
(fusec.torch.program).
"""

import operator

import torch

from .values import (ExportError, V, _DTYPES, _Refused, _Unmapped,
                     _concrete, _is_size, _val)
from .writer import Draws, _Writer, is_size_node

_MAX_RANK = 8  # FZ_MAX_RANK


class Claim:
    """One node: its name, its op, whether fusec runs it, and if not, why."""
    __slots__ = ("node", "op", "claimed", "reason")

    def __init__(self, node, op, claimed, reason=None):
        self.node, self.op, self.claimed, self.reason = node, op, claimed, \
            reason

    def __repr__(self):
        if self.claimed:
            return "%s: %s -> fusec" % (self.node, self.op)
        return "%s: %s -> PyTorch (%s)" % (self.node, self.op, self.reason)


def op_name(node):
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return "%s.%s" % (t.namespace, t.name().split("::", 1)[-1])
    return getattr(t, "__name__", str(t))


def _tensors(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, torch.Tensor)]
    return []


class _Prober(_Writer):
    """The writer, made to go on past a node it cannot write."""

    def __init__(self, gm, device_type, sizes):
        super().__init__(gm, [])
        self.device_type = device_type
        self.sizes = sizes
        self.claims = []
        self.left = set()  # names of the nodes left to PyTorch
        self.random = Draws()  # random ops run on fusec's Philox, seeded
        # per call from PyTorch's generator (program.Part)

    def opaque(self, node):
        v = _val(node)
        if isinstance(v, torch.Tensor):
            return self.stand_in(node, v)
        if isinstance(v, (list, tuple)):
            return [self.stand_in(node, x) if isinstance(x, torch.Tensor)
                    else None for x in v]
        if _is_size(v):
            return self.concrete(v)
        return v

    def concrete(self, v):
        return _concrete(v, self.sizes)

    def stand_in(self, node, t):
        dt = _DTYPES.get(t.dtype, "f32")
        return V(self.fresh(node.name), dt, self.shape_of(t))

    def check_tensors(self, node):
        """Refuses a node that reads or makes a tensor fusec cannot hold
        here: a dtype it lacks, another device, too high a rank."""
        vals = _tensors(_val(node))
        for a in node.all_input_nodes:
            vals += _tensors(_val(a))
        for t in vals:
            if t.dtype not in _DTYPES:
                raise _Refused("dtype %s has no fusec dtype" % t.dtype)
            if t.device.type != self.device_type:
                raise _Refused("a tensor on %s (fusec runs this graph on %s)"
                               % (t.device.type, self.device_type))
            if t.dim() > _MAX_RANK:
                raise _Refused("rank %d (fusec: at most %d)" %
                               (t.dim(), _MAX_RANK))

    def run(self):
        for node in self.gm.graph.nodes:
            self.node = node
            if node.op in ("placeholder", "get_attr"):  # a part's inputs
                self.env[node] = self.opaque(node)
                continue
            if node.op == "output":
                continue
            if _is_size(_val(node)):  # size arithmetic: PyTorch's, always
                self.env[node] = self.opaque(node)
                continue
            reason = None
            try:
                if node.op != "call_function":
                    raise _Unmapped(node.op)
                if node.target is operator.getitem and \
                        node.args[0].name in self.left:
                    # an element of a node PyTorch runs: part of it, with
                    # no claim of its own
                    self.env[node] = self.opaque(node)
                    self.left.add(node.name)
                    continue
                self.check_tensors(node)
                self.env[node] = self.dispatch(node, self.load(node.args),
                                               self.load(node.kwargs))
            except _Unmapped as e:
                reason = "no fusec mapping for %s" % e.args[0]
            except (_Refused, ExportError) as e:
                reason = str(e.args[0])
            except Exception as e:  # noqa: BLE001: a handler's failure is
                # a fallback, never the model's failure
                reason = "%s: %s" % (type(e).__name__, e)
            if reason is not None:
                self.env[node] = self.opaque(node)
                self.left.add(node.name)
            self.claims.append(Claim(node.name, op_name(node),
                                     reason is None, reason))
        return None


def sizes_for_parts(gm, claimed):
    """Names of the size nodes (Dynamo's sym_size and arithmetic on sizes)
    that can go into the parts beside the claimed nodes (a set of names):
    those whose every user is claimed or is such a size node. Left out,
    each is a PyTorch node between the tensor it reads and the claimed
    node it feeds, and the partitioner cuts the graph there: a decoder's
    step with a KV cache of symbolic length (sym_size of each layer's
    concatenated cache, read by its views) became one part per layer. Its
    value inside a part is its meta's at the part's binding of sizes."""
    inside = set()
    for node in reversed(gm.graph.nodes):
        if node.name in claimed or not is_size_node(node) or \
                not node.users:
            continue
        if all(u.name in claimed or u.name in inside for u in node.users):
            inside.add(node.name)
    return inside


def claim(gm, device_type, sizes=None):
    """[Claim] for the call_function nodes of gm (a graph of ATen ops with
    node.meta["val"]), for tensors on device_type ("cpu" or "cuda")."""
    p = _Prober(gm, device_type, sizes or {})
    p.run()
    return p.claims
