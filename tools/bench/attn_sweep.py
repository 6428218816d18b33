#!/usr/bin/env python3
"""attn_sweep.py: the attention sweep against the interpreter, one trace
at a time, recorded as JSON.

    nice -n 10 python3 tools/bench/attn_sweep.py --lengths 4097 \\
        [--dims 64,80,128] [--dtypes f32,bf16] [--device cpu] \\
        [--fusec build/tools/fusec] [-o tools/bench/results/attn_sweep-...json]

For every (length, head dim, dtype) it writes tools/gen/attn_cases.py's
file (the variants plain, causal, GQA 4:1, a bool padding mask, a window
of 16, softcap with a float mask, each forward, dq, dk and dv; and the
decomposed eager form) and runs each trace of it alone with
`fusec run --device DEVICE --check` against the reference interpreter:
its line records pass or fail, the worst error and where, how close it
came to the tolerance (the check's "x tolerance"), and the wall seconds
of the whole run (compiling, the kernels, the interpreter). The JSON is
rewritten after every trace, so a sweep stopped early keeps what it did.
tools/bench/attn_sweep.sh is the same sweep by whole files, as text.
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHECK = re.compile(r"^check: (\w+): max abs error (\S+), max rel error (\S+);"
                   r" worst (\S+): got (\S+), want (\S+) \((\S+) x tolerance\)")


def split_traces(text):
    """The traces of a file, each as (name, text)."""
    out = []
    for chunk in re.split(r"(?m)^(?=trace )", text):
        if chunk.startswith("trace "):
            out.append((chunk.split()[1].split("(")[0], chunk))
    return out


def git_head():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def run_one(a, path):
    """One trace: its check line parsed, and the seconds."""
    t0 = time.time()
    try:
        p = subprocess.run([a.fusec, "run", path, "--device", a.device, "--check"],
                           capture_output=True, text=True, timeout=a.timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timed out after %d s" % a.timeout,
                "seconds": round(time.time() - t0, 1)}
    r = {"seconds": round(time.time() - t0, 1), "rc": rc}
    m = next((CHECK.match(l) for l in out.splitlines() if CHECK.match(l)), None)
    if m:
        r.update(ok=m.group(1) == "ok" and rc == 0, max_abs_err=float(m.group(2)),
                 max_rel_err=float(m.group(3)), worst=m.group(4),
                 worst_got=float(m.group(5)), worst_want=float(m.group(6)),
                 x_tolerance=float(m.group(7)))
    else:
        r.update(ok=False, error=out.strip()[-2000:])
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(prog="attn_sweep.py", description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4097")
    ap.add_argument("--dims", default="64,80,128")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fusec", default=os.path.join(ROOT, "build", "tools", "fusec"))
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per trace")
    ap.add_argument("-o", "--output")
    a = ap.parse_args(argv)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = a.output or os.path.join(HERE, "results", "attn_sweep-%s-%s.json" % (a.device, stamp))
    doc = {
        "command": " ".join(["python3", "tools/bench/attn_sweep.py"] + (argv or sys.argv[1:])),
        "what": "tools/gen/attn_cases.py traces, each run alone: fusec run --device %s "
                "--check against the reference interpreter (f64); seconds are the wall "
                "time of the whole run (compile, kernels, interpreter)" % a.device,
        "commit": git_head(), "started": stamp, "host": platform.node(),
        "cpus": os.cpu_count(), "load_at_start": os.getloadavg(),
        "fusec_threads": os.environ.get("FUSEC_THREADS"), "cases": [],
    }
    tmp = tempfile.mkdtemp(prefix="attn-sweep-")
    os.environ.setdefault("FUSEC_CACHE_DIR", os.path.join(tmp, "cache"))
    for T in a.lengths.split(","):
        for D in a.dims.split(","):
            for dt in a.dtypes.split(","):
                gen = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen", "attn_cases.py"),
                                      "--lengths", T, "--dims", D, "--dtypes", dt],
                                     capture_output=True, text=True, check=True).stdout
                for name, text in split_traces(gen):
                    path = os.path.join(tmp, name + ".trace")
                    with open(path, "w") as f:
                        f.write(text)
                    r = {"trace": name, "length": int(T), "head_dim": int(D), "dtype": dt}
                    r.update(run_one(a, path))
                    doc["cases"].append(r)
                    print("%-28s %s %s (%.0f s)" % (name, "ok" if r["ok"] else "FAIL",
                          "%.2f x tolerance" % r["x_tolerance"] if "x_tolerance" in r
                          else r.get("error", ""), r["seconds"]), flush=True)
                    doc["load_at_end"] = os.getloadavg()
                    doc["all_ok"] = all(c["ok"] for c in doc["cases"])
                    with open(out, "w") as f:
                        json.dump(doc, f, indent=1)
                    os.unlink(path)
    print("%d traces, %s; %s" % (len(doc["cases"]), "all ok" if doc["all_ok"] else "FAILURES", out))
    return 0 if doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
