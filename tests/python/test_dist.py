"""fusec.torch.nccl_unique_id: rank 0's NCCL id reaches every rank of a
torch.distributed process group (gloo here, two processes on this machine;
torchrun across machines uses the same call). Skipped where libnccl.so.2
cannot be opened. The NCCL communicator itself needs GPUs: not tested here."""

import ctypes
import os
import sys
import tempfile
import unittest

import fzcheck

fzcheck.need_torch()

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import fusec  # noqa: E402
import fusec.torch  # noqa: E402
from fusec import _lib  # noqa: E402


def _have_nccl():
    lib = _lib.load()
    buf = ctypes.create_string_buffer(128)
    err = ctypes.c_void_p()
    ok = lib.fz_nccl_unique_id(buf, ctypes.byref(err)) == 0
    _lib.take_string(lib, err.value)
    return ok


def _worker(rank, world, store_path, out_dir):
    dist.init_process_group("gloo", init_method="file://" + store_path,
                            rank=rank, world_size=world)
    try:
        uid = fusec.torch.nccl_unique_id()
        with open(os.path.join(out_dir, "id%d" % rank), "wb") as f:
            f.write(uid)
    finally:
        dist.destroy_process_group()


class TestNcclId(unittest.TestCase):
    def test_broadcast_over_process_group(self):
        if not _have_nccl():
            self.skipTest("libnccl.so.2 not available")
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(_worker, args=(2, os.path.join(d, "store"), d), nprocs=2)
            ids = [open(os.path.join(d, "id%d" % r), "rb").read() for r in range(2)]
        self.assertEqual(len(ids[0]), 128)
        self.assertEqual(ids[0], ids[1])
        self.assertNotEqual(ids[0], bytes(128))


if __name__ == "__main__":
    unittest.main()
