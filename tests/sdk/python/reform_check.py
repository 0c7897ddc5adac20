"""ddprun_sdk under ddprun --restart_policy=inplace, 4 ranks (tests/sdk/sdk_api_test.cc):
every rank all-reduces in a loop; rank 2, in its first process, SIGKILLs itself after 50
iterations. Each survivor must get ddprun_sdk.PeerLostError (code 8) at once, re-form its
group in its own process with ddprun_sdk.reconfigure(pg), and all-reduce rank + 1 with the
replacement (which starts in the new round). Every rank writes
<REFORM_OUT>.<rank>: "pid=.. round=.. sum=.. lost=<code> <seconds from the kill>".
"""
import os
import signal
import sys
import time

import numpy as np

import ddprun_sdk as ddp

out = os.environ["REFORM_OUT"]
killed = out + ".killed"
pg = ddp.init()
lost = "none"
if not os.path.exists(killed) or pg.rank != 2:
    x = np.ones(1024, np.float32)
    t0 = time.monotonic()
    try:
        for i in range(100000):
            if pg.rank == 2 and i == 50:
                with open(killed, "w") as f:
                    f.write("%d\n" % time.monotonic_ns())
                os.kill(os.getpid(), signal.SIGKILL)
            pg.allreduce(x)
            if time.monotonic() - t0 > 60:
                sys.exit("no peer was lost within 60 s")
    except ddp.PeerLostError as e:
        with open(killed) as f:
            at = int(f.read())
        lost = "%d %.1fms" % (e.code, (time.monotonic_ns() - at) / 1e6)
        print("rank %d: %s" % (pg.rank, e), file=sys.stderr)
        ddp.reconfigure(pg)
y = np.full(1000, pg.rank + 1, np.float32)
pg.allreduce(y)
with open("%s.%d" % (out, pg.rank), "w") as f:
    f.write("pid=%d round=%d sum=%g lost=%s\n" % (os.getpid(), pg.round, y[0], lost))
pg.barrier()
