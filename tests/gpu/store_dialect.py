#!/usr/bin/env python3
"""The TCPStore dialect of this interpreter's torch, against torch's own server and ddprun's agent store.

    python3 tests/gpu/store_dialect.py --ddprun .device/gpu/bin/ddprun --out DIR

1. torch's own TCPStore server (its default backend) behind a recording proxy;
   a client process runs every store operation this torch's Python API has
   (OPS below) and records each result or error.
2. The same client, through the same kind of proxy, against ddprun's agent
   store: the script runs itself as a ddprun worker (--nproc_per_node=1) and
   points the client at MASTER_ADDR:MASTER_PORT. The worker then forms an NCCL
   process group on that store (env://; world size 1: one GPU), all-reduces a
   CUDA tensor, and destroys the group.
Prints "PASS"/"FAIL" per operation (results equal, except num_keys, which
counts the agent store's own keys too), the query bytes of each side, and
writes DIR/store_dialect.json with both results and both byte streams in hex.
Exit 1 when any operation differs or the NCCL group fails, 0 otherwise.
"""
import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

OPS = r'''
import datetime, json, sys
import torch.distributed as dist
host, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=10))
res = []
def op(name, f):
    try:
        v = f()
        if isinstance(v, bytes): v = "bytes:" + v.hex()
        elif isinstance(v, list): v = ["bytes:" + x.hex() if isinstance(x, bytes) else x for x in v]
        elif v is not None and not isinstance(v, (int, float, bool, str)): v = repr(v)
        res.append([name, "ok", v])
    except Exception as e:
        res.append([name, "error", type(e).__name__])
p = "dialect/"
op("set", lambda: s.set(p + "k", "v"))
op("get", lambda: s.get(p + "k"))
op("add", lambda: s.add(p + "n", 5))
op("add_negative", lambda: s.add(p + "n", -2))
op("compare_set_new", lambda: s.compare_set(p + "cas", "", "first"))
op("compare_set_match", lambda: s.compare_set(p + "cas", "first", "second"))
op("compare_set_mismatch", lambda: s.compare_set(p + "cas", "wrong", "third"))
op("compare_set_missing_expected", lambda: s.compare_set(p + "cas2", "x", "y"))
op("wait", lambda: s.wait([p + "k", p + "n"]))
op("check_present", lambda: s.check([p + "k"]))
op("check_absent", lambda: s.check([p + "nope"]))
op("num_keys_type", lambda: type(s.num_keys()).__name__)
op("delete_key", lambda: s.delete_key(p + "k"))
op("delete_key_again", lambda: s.delete_key(p + "k"))
op("append", lambda: s.append(p + "a", "x"))
op("append_again", lambda: s.append(p + "a", "y"))
op("get_appended", lambda: s.get(p + "a"))
op("multi_set", lambda: s.multi_set([p + "m1", p + "m2"], ["v1", "v2"]))
op("multi_get", lambda: s.multi_get([p + "m1", p + "m2"]))
op("wait_timeout", lambda: s.wait([p + "never"], datetime.timedelta(milliseconds=200)))
def get_missing():
    s.set_timeout(datetime.timedelta(milliseconds=200))
    try:
        return s.get(p + "missing")
    finally:
        s.set_timeout(datetime.timedelta(seconds=10))
op("get_timeout", get_missing)
op("binary_value", lambda: (s.set(p + "b", bytes(range(256))), s.get(p + "b"))[1])
for name in ("queue_push", "queue_pop", "queue_len", "list_keys", "has_extended_api", "libuvBackend"):
    op("has_" + name, lambda name=name: hasattr(s, name))
if hasattr(s, "queue_push"):
    op("queue_push", lambda: s.queue_push(p + "q", "one"))
    op("queue_push2", lambda: s.queue_push(p + "q", "two"))
    op("queue_len", lambda: s.queue_len(p + "q"))
    op("queue_pop", lambda: s.queue_pop(p + "q", block=False))
    op("queue_pop2", lambda: s.queue_pop(p + "q"))
    op("queue_pop_empty", lambda: s.queue_pop(p + "q", block=False))
if hasattr(s, "list_keys"):
    op("list_keys_has_ours", lambda: sorted(k for k in s.list_keys() if k.startswith(p)))
if hasattr(s, "has_extended_api"):
    op("has_extended_api", lambda: s.has_extended_api())
json.dump(res, open(out, "w"))
'''


class Proxy:
    """Listens on loopback; each connection is relayed to target and both directions recorded."""

    def __init__(self, host, port):
        self.target = (host, port)
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _pump(self, src, dst, buf):
        while True:
            try:
                d = src.recv(65536)
            except OSError:
                d = b""
            if not d:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            buf.append(d)
            try:
                dst.sendall(d)
            except OSError:
                return

    def _accept(self):
        while True:
            c, _ = self.lsock.accept()
            s = socket.create_connection(self.target)
            up, down = [], []
            self.conns.append((up, down))
            threading.Thread(target=self._pump, args=(c, s, up), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, down), daemon=True).start()

    def streams(self):
        return [{"client_to_server": b"".join(u).hex(), "server_to_client": b"".join(d).hex()}
                for u, d in self.conns]


def run_ops(host, port, out_json):
    proxy = Proxy(host, port)
    path = out_json + ".ops"
    r = subprocess.run([sys.executable, "-c", OPS, "127.0.0.1", str(proxy.port), path], capture_output=True,
                       text=True, timeout=120)
    time.sleep(0.3)
    res = json.load(open(path)) if os.path.exists(path) else [["client", "error", r.stderr[-2000:]]]
    return res, proxy.streams()


def nccl_group():
    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available():
        return {"skipped": "torch sees no GPU"}
    t0 = time.time()
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
    t1 = time.time()
    x = torch.full((1 << 20,), float(dist.get_rank() + 1), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    t2 = time.time()
    dist.barrier()
    ok = bool((x == 1.0).all().item())
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    dist.destroy_process_group()
    return {"ok": ok, "world_size": 1, "init_s": round(t1 - t0, 3), "first_all_reduce_s": round(t2 - t1, 3),
            "nccl": nccl}


def worker(out):
    res, streams = run_ops(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), out)
    try:
        ng = nccl_group()
    except Exception as e:
        ng = {"ok": False, "error": repr(e)[:1000]}
    json.dump({"results": res, "streams": streams, "nccl": ng, "env": {
        k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")}},
        open(out, "w"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    import torch
    import torch.distributed as dist
    print(f"torch {torch.__version__}", flush=True)
    server = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    backend = "libuv" if getattr(server, "libuvBackend", False) else "classic"
    tmp = tempfile.mkdtemp(prefix="store_dialect_")  # not $OUT: the device tool brings back 8 files
    torch_res, torch_streams = run_ops("127.0.0.1", server.port, os.path.join(tmp, "torch.json"))
    wout = os.path.join(tmp, "ddprun.json")
    r = subprocess.run([a.ddprun, "--nproc_per_node=1", "--dashboard_port=off", os.path.abspath(__file__),
                        "--worker", wout], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, PYTHON_EXEC=sys.executable))
    if not os.path.exists(wout):
        print(f"FAIL the ddprun worker wrote nothing (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return 1
    d = json.load(open(wout))
    bad = 0
    theirs = {x[0]: x for x in d["results"]}
    for name, kind, val in torch_res:
        other = theirs.get(name)
        same = other == [name, kind, val]
        bad += not same
        print(f"{'PASS' if same else 'FAIL'} {name}: torch's server {kind} {val!r}; ddprun {other[1:] if other else 'missing'}")
    for name in theirs.keys() - {x[0] for x in torch_res}:
        bad += 1
        print(f"FAIL {name}: only ddprun ran it")
    for side, streams in (("torch's server (" + backend + ")", torch_streams), ("ddprun's agent store", d["streams"])):
        for i, s in enumerate(streams):
            up = bytes.fromhex(s["client_to_server"])
            print(f"{side} connection {i}: {len(up)} bytes up, {len(s['server_to_client']) // 2} down; "
                  f"first bytes up {up[:16].hex()}")
    same_down = [a_["server_to_client"] == b_["server_to_client"]
                 for a_, b_ in zip(torch_streams, d["streams"])]
    print(f"replies byte-identical per connection: {same_down} (num_keys may differ: the agent store holds keys)")
    ng = d["nccl"]
    print(("PASS" if ng.get("ok") or "skipped" in ng else "FAIL") + f" NCCL process group on the agent store: {ng}")
    bad += not (ng.get("ok") or "skipped" in ng)
    json.dump({"torch": torch.__version__, "server_backend": backend, "torch_results": torch_res,
               "torch_streams": torch_streams, "ddprun": d}, open(os.path.join(a.out, "store_dialect.json"), "w"),
              indent=1)
    print(f"{'all equal' if not bad else str(bad) + ' difference(s)'}; wrote {a.out}/store_dialect.json")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
