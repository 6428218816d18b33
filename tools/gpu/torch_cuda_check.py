#!/usr/bin/env python3
"""torch_cuda_check.py: fusec.Program(device="cuda") against PyTorch on CUDA.

    PYTHONPATH=tools/python FUSEC_LIBRARY=build/libfusec.so \\
        python3 tools/gpu/torch_cuda_check.py [--json FILE]

For each model (a nanoGPT block, Hugging Face Llama and GPT-2 from small
configs with random weights), kind (fwd; bwd: loss and every parameter
gradient through torch.autograd.grad) and dtype (f32, bf16): the step is
exported as tests/python/test_models.py does, moved to the GPU, run by
fusec on CUDA tensors (outputs allocated by torch on the same device, the
program on torch's current stream, its arena from torch's caching
allocator) and by PyTorch on CUDA, and compared with the CPU tolerances of
test_models.py: ||fusec - torch|| / ||torch|| and max|fusec - torch| /
max|torch| within 1e-5 for f32 and 1e-2 for bf16. PyTorch's f32 matmuls run
without TF32 here (torch.backends.cuda.matmul.allow_tf32 = False), so both
sides compute full f32 products.

Exit status: 0 when every case passes, 1 otherwise, 77 without a GPU.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))


def to_dev(tree, dev):
    import torch
    if isinstance(tree, torch.Tensor):
        return tree.detach().to(dev)
    if isinstance(tree, dict):
        return {k: to_dev(v, dev) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_dev(v, dev) for v in tree)
    return tree


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("torch_cuda_check: skipped: torch sees no CUDA device")
        return 77
    import fusec
    import fusec.torch as ft
    from fusec import examples
    import fzcheck
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda", torch.cuda.current_device())
    results, failed = [], 0
    for model in ("nanogpt", "llama", "gpt2"):
        for kind in ("fwd", "bwd"):
            for dtype in (torch.float32, torch.bfloat16):
                dname = str(dtype).split(".")[1]
                case = {"model": model, "kind": kind, "dtype": dname}
                try:
                    step, args = examples.build(model, kind, dtype=dtype)
                    text = ft.export(step, *args)
                    prog = fusec.Program(text, device="cuda")
                    case["ran_on"] = prog.device
                    params, data = to_dev(args, dev)
                    ins = [t for t in params.values()] + [data]
                    t0 = time.time()
                    out = prog(*ins)
                    torch.cuda.synchronize()
                    case["fusec_seconds"] = round(time.time() - t0, 4)
                    ref = step(params, data)
                    en, em = fzcheck.worst(out, ref)
                    tol = fzcheck.TOL[dname]
                    case.update(rel_norm=en, rel_max=em, tol=tol,
                                ok=bool(en <= tol and em <= tol and
                                        prog.device == "cuda"))
                except Exception as e:  # reported per case, the sweep goes on
                    case.update(ok=False, error="%s: %s" % (type(e).__name__, e))
                failed += not case["ok"]
                results.append(case)
                print("%-4s %s %s %s %s" % (
                    "ok" if case["ok"] else "FAIL", model, kind, dname,
                    case.get("error") or "rel %.2e (norm) %.2e (max), tol %g" %
                    (case["rel_norm"], case["rel_max"], case["tol"])))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev),
                       "torch": torch.__version__,
                       "cuda": torch.version.cuda,
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "failed": failed, "results": results}, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
