"""fusec.torch.dist: torch.distributed glue for fusec's collectives.

nccl_unique_id: the NCCL id that rank 0 makes and broadcasts over a
process group, for fusec's NCCL communicator. Nothing here is about
exporting or compiling.
"""


def nccl_unique_id(group=None):
    """The NCCL unique id (128 bytes) every rank of `group` (a
    torch.distributed process group, default the world) agrees on: rank 0
    of the group makes it (fz_nccl_unique_id, libnccl.so.2 opened by the
    library) and broadcasts it over the group, so ranks that torchrun
    started on several machines can form fusec's NCCL communicator with no
    file and no NCCL_COMM_ID. Every rank of the group must call it.
    (The communicator itself needs a GPU; that part is untested.)"""
    import ctypes

    import torch.distributed as dist

    from .. import FusecError, _lib
    lib = _lib.load()
    obj = [None]
    if dist.get_rank(group) == 0:
        buf = ctypes.create_string_buffer(128)
        err = ctypes.c_void_p()
        st = lib.fz_nccl_unique_id(buf, ctypes.byref(err))
        if st != 0:
            msg = _lib.take_string(lib, err.value)
            raise FusecError(msg or "fz_nccl_unique_id failed",
                             lib.fz_status_name(st).decode())
        obj[0] = buf.raw
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(obj, src=src, group=group)
    return obj[0]
