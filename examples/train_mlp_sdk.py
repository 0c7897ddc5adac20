#!/usr/bin/env python3
"""A data-parallel numpy trainer on the worker SDK (no PyTorch):
    PYTHONPATH=build/python build/bin/ddprun --nproc_per_node=2 examples/train_mlp_sdk.py

Linear regression y = X w + noise, data sharded by rank like DistributedSampler
(reshuffled per epoch with seed + epoch); the Reducer averages gradients.
Exits 1 unless the loss fell and the weights are identical on every rank.
"""
import os
import sys

import numpy as np

# PYTHONPATH first; else the default build tree.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
import ddprun_sdk as ddp  # noqa: E402

pg = ddp.init()
rank, world = pg.rank, pg.size
rng = np.random.default_rng(1234)  # the same data on every rank
X = rng.standard_normal((4096, 32)).astype(np.float32)
true_w = rng.standard_normal(32).astype(np.float32)
y = X @ true_w + 0.01 * rng.standard_normal(4096).astype(np.float32)

w = np.random.default_rng(rank).standard_normal(32).astype(np.float32)  # differs per rank
b = np.zeros(1, np.float32)
pg.broadcast_parameters([w, b])  # rank 0's initial values everywhere
gw, gb = np.zeros_like(w), np.zeros_like(b)
reducer = ddp.Reducer(pg)
reducer.register(gw)
reducer.register(gb)

losses = []
for epoch in range(5):
    idx = np.random.default_rng(42 + epoch).permutation(len(X))[rank::world]
    total, steps = 0.0, 0
    for s in range(0, len(idx) - 31, 32):
        batch = idx[s:s + 32]
        err = X[batch] @ w + b[0] - y[batch]
        gb[:] = err.mean()
        reducer.mark_ready(1)
        gw[:] = X[batch].T @ err / len(batch)
        reducer.mark_ready(0)
        reducer.finish()
        w -= 0.05 * gw
        b -= 0.05 * gb
        total += float(0.5 * np.mean(err ** 2))
        steps += 1
    loss = np.array([total / steps])
    pg.allreduce(loss, op="avg")
    losses.append(float(loss[0]))
    if rank == 0:
        print("epoch %d: loss %.6f" % (epoch, loss[0]), flush=True)

hi, lo = w.copy(), w.copy()
pg.allreduce(hi, op="max")
pg.allreduce(lo, op="min")
same = bool(np.array_equal(hi, lo))
if rank == 0:
    print("loss %.6f -> %.6f; weights identical on all %d ranks: %s" % (losses[0], losses[-1], world, same))
sys.exit(0 if same and losses[-1] < losses[0] else 1)
