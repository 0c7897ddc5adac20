"""Records what this machine's torch TCPStore clients send, as fuzz seeds.

A proxy in front of torch's own TCPStore server saves each connection's
client->server bytes. Two client processes run the store operations, then
try init_process_group(env://) through the same store (with torch 1.13 that
part times out after the store traffic, which is what is kept).

    /usr/bin/python3 tests/fuzz/capture_torch_store.py /tmp/cap
    (then copy the non-empty files to tests/fuzz/corpus/c10d_wire/capture_*)
"""
import datetime, os, socket, sys, threading, subprocess, time
out_dir = sys.argv[1]
import torch, torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, 3, True, datetime.timedelta(seconds=30), wait_for_workers=False)
sport = server.port
lsock = socket.socket(); lsock.bind(("127.0.0.1", 0)); lsock.listen(16)
pport = lsock.getsockname()[1]
conns = []
def pump(src, dst, buf):
    while True:
        try:
            d = src.recv(65536)
        except OSError:
            d = b""
        if not d:
            try: dst.shutdown(socket.SHUT_WR)
            except OSError: pass
            return
        if buf is not None: buf.append(d)
        dst.sendall(d)
def accept():
    while True:
        c, _ = lsock.accept()
        s = socket.create_connection(("127.0.0.1", sport))
        buf = []
        conns.append(buf)
        threading.Thread(target=pump, args=(c, s, buf), daemon=True).start()
        threading.Thread(target=pump, args=(s, c, None), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
script = r'''
import datetime, sys, os
import torch, torch.distributed as dist
port = int(sys.argv[1])
s = dist.TCPStore("127.0.0.1", port, 3, False, datetime.timedelta(seconds=10))
s.set("k", "v"); s.get("k"); s.add("n", 5); s.compare_set("cas", "", "first")
s.compare_set("cas", "first", "second"); s.wait(["k", "n"]); s.num_keys(); s.delete_key("k")
try:
    s.wait(["never"], datetime.timedelta(milliseconds=200))
except RuntimeError:
    pass
if os.environ.get("PG"):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", init_method="env://", rank=int(os.environ["RANK"]), world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    t = torch.ones(2); dist.all_reduce(t); dist.barrier(); dist.destroy_process_group()
print("ok")
'''
env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PG="1")
ps = [subprocess.Popen([sys.executable, "-c", script, str(pport)], env=dict(env, RANK=str(r))) for r in range(2)]
rc = [p.wait(timeout=120) for p in ps]
time.sleep(0.5)
n = 0
for i, buf in enumerate(conns):
    data = b"".join(buf)
    if data:
        open(os.path.join(out_dir, "torch%s_conn%d" % (torch.__version__.split("+")[0], i)), "wb").write(data)
        n += 1
print("rc", rc, "wrote", n, "captures of", len(conns), "connections", [len(b"".join(b)) for b in conns])
