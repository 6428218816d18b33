"""fusec.torch: the PyTorch side of fusec.

    model = torch.compile(model, backend="fusec")   # train through fusec
    text = fusec.torch.export(fn, *example_args)   # fn as fusec trace text

The package, one module per thing it holds:
  backend    the torch.compile backend (AOTAutograd's compilers), explain,
             stats
  program    a graph cut into parts that run as fusec programs, the rest
             in PyTorch
  claims     which nodes fusec takes, and the reason for each it leaves
  exporter   export(): traces fn with make_fx and writes it as trace text
             (how, and the numerics rules, in its docstring); op_counts
  writer     the walk over the FX graph that writes statements
  ops        the ATen -> fusec op mapping table and its handlers
  symbolic   symbolic extents (export(symbolic=))
  attention  scaled_dot_product_attention to the attention primitive,
             or as traceable math
  values     dtypes, trace values, literals, ExportError
  dist       nccl_unique_id for torch.distributed process groups

Only the names below are the public API; the rest may move.
"""

from .backend import backend, explain, stats
from .dist import nccl_unique_id
from .exporter import ExportedTrace, _peak_bytes, export, op_counts
from .values import ExportError

__all__ = ["backend", "explain", "stats", "export", "ExportError",
           "ExportedTrace", "op_counts", "nccl_unique_id"]
