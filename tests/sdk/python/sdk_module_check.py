#!/usr/bin/env python3
"""The Python module (worker_sdk/python/ddprun_sdk.py) as a trainer uses it,
under the real ddprun at any world size (tests/sdk/sdk_api_test.cc runs it):

    PYTHONPATH=build/python PYTHON_EXEC=/usr/bin/python3 \
        build/bin/ddprun --nproc_per_node=3 tests/sdk/python/sdk_module_check.py

Every rank issues the same collectives in the same order; a failed check is
reported ("rank R: FAIL: ...") and the script goes on, so the ranks stay in
step, and exits 1 at the end. Prints "rank R: all checks passed" otherwise.
Only a broken SDK call (an exception) ends it early; the peers then see a
dead peer and fail too.

With --outside (run without ddprun) it checks that init() refuses with a
message naming DDPRUN_STORE_ADDR and showing how to run under ddprun.

SDK_CHECK_DIR (optional) is a directory shared by the ranks (the barrier
check writes a file per rank there); default: a temporary one per job.
"""
import os
import shutil
import sys
import tempfile

import numpy as np

import ddprun_sdk as ddp

FAILURES = []
RANK = int(os.environ.get("RANK") or 0)


def fail(msg):
    FAILURES.append(msg)
    print("rank %d: FAIL: %s" % (RANK, msg), flush=True)


def check(cond, msg):
    if not cond:
        fail(msg)
    return bool(cond)


def expect_error(fn, substr, what, code=None):
    """fn() must raise ddp.Error whose message contains substr (and .code == code)."""
    try:
        fn()
    except ddp.Error as e:
        ok = check(substr in str(e), "%s: message %r lacks %r" % (what, str(e), substr))
        if code is not None:
            ok = check(e.code == code, "%s: code %d (%s), want %d" % (what, e.code, e.kind, code)) and ok
        return str(e)
    except Exception as e:  # noqa: BLE001: any other exception is the failure
        fail("%s: raised %s (%s), want ddprun_sdk.Error" % (what, type(e).__name__, e))
        return None
    fail("%s: no exception" % what)
    return None


# ---------------------------------------------------------------- outside ddprun

def outside():
    for k in list(os.environ):
        if k.startswith("DDPRUN_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            del os.environ[k]
    msg = expect_error(ddp.init, "DDPRUN_STORE_ADDR is not set", "init() outside ddprun", code=1)
    if msg is not None:
        check("ddprun --nproc_per_node=" in msg, "init() outside ddprun: no ddprun command line in %r" % msg)
        print("init() outside ddprun raised: %s" % msg.replace("\n", " | "))


# ---------------------------------------------------------------- values and references

INT_KINDS = ("int32", "int64")
HALF_KINDS = ("float16", "bfloat16")


def values(rank, n, kind, salt):
    """Rank- and salt-specific values, exactly representable in `kind`, whose
    sums over a few ranks are exact too; any rank can compute any rank's."""
    rng = np.random.default_rng([salt, rank, 17])
    if kind in HALF_KINDS:
        return rng.integers(-8, 9, n).astype(np.float64)
    if kind in INT_KINDS:
        return rng.integers(-1000, 1001, n).astype(np.float64)
    return rng.integers(-1000000, 1000001, n).astype(np.float64) / 1024.0


def reduce_rows(op, kind, vs):
    """The reference reduction over axis 0 (one row per rank), in float64."""
    if op == "max":
        return vs.max(axis=0)
    if op == "min":
        return vs.min(axis=0)
    s = vs.sum(axis=0)
    if op == "avg":  # integers truncate, as in C
        return np.trunc(s / len(vs)) if kind in INT_KINDS else s / len(vs)
    return s


def reference(op, kind, world, n, salt):
    return reduce_rows(op, kind, np.stack([values(r, n, kind, salt) for r in range(world)]))


# The SDK averages in the element type; a sum of exact values is exact.
TOL = {"float32": 1e-6, "float64": 1e-12, "float16": 1e-3, "bfloat16": 8e-3}


def compare(got, want, kind, op, what):
    """got: float64 view of the result; want: float64 reference."""
    if got.shape != want.shape:
        return fail("%s: shape %s, want %s" % (what, got.shape, want.shape))
    if op == "avg" and kind not in INT_KINDS:
        bad = np.abs(got - want) > TOL[kind] * np.maximum(1.0, np.abs(want))
    else:
        bad = got != want
    if bad.any():
        i = int(np.argmax(bad))
        fail("%s: %d of %d elements differ; first at %d: got %r, want %r" %
             (what, int(bad.sum()), got.size, i, got[i], want[i]))


# ---------------------------------------------------------------- numpy collectives

NP_KINDS = ["float32", "float64", "int32", "int64", "float16"]
OPS = ["sum", "avg", "max", "min"]
SIZES = [0, 1, 7, 1001]


def np_collectives(pg):
    world, rank = pg.size, pg.rank
    salt = 1000
    for kind in NP_KINDS:
        for op in OPS:
            for n in SIZES + ([300007] if kind == "float32" and op == "sum" else []):
                salt += 1
                a = values(rank, n, kind, salt).astype(kind)
                pg.allreduce(a, op=op)
                compare(a.astype(np.float64), reference(op, kind, world, n, salt).astype(kind).astype(np.float64),
                        kind, op, "numpy allreduce %s %s n=%d" % (kind, op, n))
        for root in range(world):
            for n in SIZES:
                salt += 1
                a = values(rank, n, kind, salt).astype(kind)
                pg.broadcast(a, root=root)
                compare(a.astype(np.float64), values(root, n, kind, salt), kind, "bcast",
                        "numpy broadcast %s root=%d n=%d" % (kind, root, n))
        for n in [0, 1, 13, 4001]:
            salt += 1
            inp = values(rank, n, kind, salt).astype(kind)
            out = np.full(n * world, 99, kind)
            pg.allgather(inp, out)
            want = np.concatenate([values(r, n, kind, salt) for r in range(world)]) if n else np.zeros(0)
            compare(out.astype(np.float64), want, kind, "gather", "numpy allgather %s n=%d" % (kind, n))
            for op in OPS:
                salt += 1
                rin = values(rank, n * world, kind, salt).astype(kind)
                rout = np.full(n, 99, kind)
                pg.reduce_scatter(rin, rout, op=op)
                want = _rs_reference(op, kind, world, n, salt, rank)
                compare(rout.astype(np.float64), want.astype(kind).astype(np.float64), kind, op,
                        "numpy reduce_scatter %s %s n=%d" % (kind, op, n))

    # 2-D and 0-d arrays: the element count is what matters.
    m = np.arange(12, dtype=np.float64).reshape(3, 4) + rank
    pg.allreduce(m)
    check(np.array_equal(m, (np.arange(12).reshape(3, 4) * world + world * (world - 1) / 2)),
          "numpy allreduce of a 3x4 array: %r" % m)
    z = np.array(rank + 1.0, dtype=np.float32)
    pg.allreduce(z, op="max")
    check(float(z) == world, "numpy allreduce of a 0-d array: %r, want %d" % (float(z), world))

    # A contiguous view with an offset: only the view changes.
    base = np.full(10, rank + 1, np.int64)
    pg.allreduce(base[3:6])
    want = np.full(10, rank + 1, np.int64)
    want[3:6] = world * (world + 1) // 2
    check(np.array_equal(base, want), "numpy allreduce of a slice [3:6] of 10: %r, want %r" % (base, want))

    # pg.empty: zero-filled memory from ddp_alloc_memory; a large all-reduce
    # of it (the shared memory path's direct fold at 3 ranks) sums exactly.
    e = pg.empty((300007,), np.float32)
    check(e.shape == (300007,) and e.dtype == np.float32 and not e.any(),
          "pg.empty: %r %r, any=%r" % (e.shape, e.dtype, e.any()))
    for rep in range(2):
        e[:] = (np.arange(300007) % 7) * (rank + 1) + rep
        pg.allreduce(e)
        want = (np.arange(300007) % 7) * (world * (world + 1) // 2) + rep * world
        check(np.array_equal(e, want.astype(np.float32)), "allreduce of pg.empty memory, rep %d" % rep)
    m2 = pg.empty((3, 4), "int64")
    m2[:] = rank
    pg.allreduce(m2)
    check(np.array_equal(m2, np.full((3, 4), world * (world - 1) // 2)), "allreduce of pg.empty((3, 4))")
    del e, m2

    # A read-only input is fine where the SDK only reads it.
    ro = np.full(5, rank, np.int32)
    ro.flags.writeable = False
    out = np.zeros(5 * world, np.int32)
    try:
        pg.allgather(ro, out)
        check(np.array_equal(out, np.repeat(np.arange(world, dtype=np.int32), 5)),
              "allgather of a read-only input: %r" % out)
    except ddp.Error as e:
        fail("allgather of a read-only input (only read) raised: %s" % e)
        pg.allgather(ro.copy(), out)  # keep the ranks in step
    rin = np.full(5 * world, rank, np.int32)
    rin.flags.writeable = False
    rout = np.zeros(5, np.int32)
    try:
        pg.reduce_scatter(rin, rout)
        check(np.array_equal(rout, np.full(5, world * (world - 1) // 2)),
              "reduce_scatter of a read-only input: %r" % rout)
    except ddp.Error as e:
        fail("reduce_scatter of a read-only input (only read) raised: %s" % e)
        pg.reduce_scatter(rin.copy(), rout)


def _rs_reference(op, kind, world, n, salt, rank):
    """reduce_scatter: this rank's block of the element-wise reduction of every
    rank's world*n input."""
    full = np.stack([values(r, n * world, kind, salt) for r in range(world)])
    return reduce_rows(op, kind, full[:, rank * n:(rank + 1) * n])


def barrier_checks(pg, shared_dir):
    """No rank leaves a barrier before every rank entered it: each rank writes
    a file before the barrier and looks for every rank's file after it."""
    world, rank = pg.size, pg.rank
    for mode in ("blocking", "async"):
        path = os.path.join(shared_dir, "barrier-%s.%d" % (mode, rank))
        with open(path, "w") as f:
            f.write("x")
        if mode == "blocking":
            check(pg.barrier() is None, "blocking barrier returned something")
        else:
            w = pg.barrier(async_op=True)
            w.wait()
        missing = [r for r in range(world)
                   if not os.path.exists(os.path.join(shared_dir, "barrier-%s.%d" % (mode, r)))]
        check(not missing, "%s barrier: left before ranks %s arrived" % (mode, missing))


def async_checks(pg):
    world, rank = pg.size, pg.rank
    # Many in flight, waited for in reverse order; each keeps its buffer alive.
    works, bufs = [], []
    for k in range(8):
        b = np.arange(1000, dtype=np.int64) + k * 1000
        bufs.append(b)
        works.append(pg.allreduce(b, async_op=True))
    check(all(isinstance(w, ddp.Work) for w in works), "allreduce(async_op=True) returned no Work")
    for w in reversed(works):
        w.wait()
    for k, b in enumerate(bufs):
        check(np.array_equal(b, (np.arange(1000) + k * 1000) * world), "async allreduce #%d: wrong result" % k)
    works[0].wait()  # a second wait is a no-op
    # is_completed() polls without blocking; it turns True by itself.
    w = pg.allreduce(np.ones(1 << 16, np.float32), async_op=True)
    for _ in range(200000):
        if w.is_completed():
            break
    check(w.is_completed(), "Work.is_completed() never turned True")
    w.wait()
    check(w.is_completed(), "Work.is_completed() is False after wait()")

    # Every collective has an async form.
    a = np.full(7, rank, np.float64)
    w1 = pg.broadcast(a, root=world - 1, async_op=True)
    g_in, g_out = np.full(3, rank, np.int32), np.zeros(3 * world, np.int32)
    w2 = pg.allgather(g_in, g_out, async_op=True)
    r_in, r_out = np.ones(4 * world, np.float32), np.zeros(4, np.float32)
    w3 = pg.reduce_scatter(r_in, r_out, op="sum", async_op=True)
    w4 = pg.barrier(async_op=True)
    w5 = pg.allreduce(np.ones(0, np.float32), async_op=True)  # zero elements
    for w in (w4, w3, w2, w1, w5):
        w.wait(timeout=60.0)
    check(np.all(a == world - 1), "async broadcast: %r" % a)
    check(np.array_equal(g_out, np.repeat(np.arange(world, dtype=np.int32), 3)), "async allgather: %r" % g_out)
    check(np.all(r_out == world), "async reduce_scatter: %r" % r_out)


# ---------------------------------------------------------------- torch

def torch_checks(pg):
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print("rank %d: SKIPPED torch tensors: cannot import torch (%s)" % (pg.rank, e), flush=True)
        return
    world, rank = pg.size, pg.rank
    kinds = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
             "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16}
    salt = 5000
    with torch.no_grad():
        for kind, tdt in kinds.items():
            for op in OPS:
                for n in (0, 1, 1001):
                    salt += 1
                    t = torch.tensor(values(rank, n, kind, salt), dtype=tdt)
                    pg.allreduce(t, op=op)
                    want = torch.tensor(reference(op, kind, world, n, salt), dtype=tdt)
                    compare(t.double().numpy(), want.double().numpy(), kind, op,
                            "torch allreduce %s %s n=%d" % (kind, op, n))
            salt += 1
            t = torch.tensor(values(rank, 33, kind, salt), dtype=tdt)
            pg.broadcast(t, root=world - 1)
            compare(t.double().numpy(), values(world - 1, 33, kind, salt), kind, "bcast",
                    "torch broadcast %s" % kind)
            salt += 1
            inp = torch.tensor(values(rank, 9, kind, salt), dtype=tdt)
            out = torch.zeros(9 * world, dtype=tdt)
            pg.allgather(inp, out)
            compare(out.double().numpy(), np.concatenate([values(r, 9, kind, salt) for r in range(world)]),
                    kind, "gather", "torch allgather %s" % kind)
            rin = torch.ones(5 * world, dtype=tdt) * (rank + 1)
            rout = torch.zeros(5, dtype=tdt)
            pg.reduce_scatter(rin, rout, op="max")
            check(bool((rout == world).all()), "torch reduce_scatter %s max: %s" % (kind, rout))

        # A contiguous view with a storage offset (data_ptr() includes it).
        base = torch.full((4, 5), float(rank + 1))
        row = base[2]
        check(row.is_contiguous() and row.storage_offset() == 10, "test setup: row 2 view")
        pg.allreduce(row)
        want = torch.full((4, 5), float(rank + 1))
        want[2] = world * (world + 1) / 2
        check(torch.equal(base, want), "torch allreduce of row 2 of a 4x5 tensor: %s" % base)
        w = pg.allreduce(torch.ones(100), async_op=True)
        w.wait()

        # Mixed numpy and torch in one call.
        a = np.full(6, rank, np.float32)
        b = torch.zeros(6 * world)
        pg.allgather(a, b)
        check(torch.equal(b, torch.arange(world).repeat_interleave(6).float()), "allgather numpy -> torch: %s" % b)

        # Bad tensors raise before anything is sent.
        expect_error(lambda: pg.allreduce(torch.zeros(4, 6).t()), "not contiguous",
                     "allreduce of a transposed (non-contiguous) tensor", code=1)
        expect_error(lambda: pg.allreduce(torch.zeros(4, dtype=torch.complex64)), "unsupported dtype complex64",
                     "allreduce of a complex64 tensor", code=1)
        expect_error(lambda: pg.allreduce(torch.zeros(4, dtype=torch.bool)), "unsupported dtype bool",
                     "allreduce of a bool tensor", code=1)

        # A Reducer over torch gradients.
        g1, g2 = torch.full((50, 20), float(rank)), torch.full((7,), float(rank + 1), dtype=torch.float64)
        r = ddp.Reducer(pg)
        r.register(g1)
        r.register(g2)
        r.mark_ready(1)
        r.mark_ready(0)
        r.finish()
        check(bool((g1 == (world - 1) / 2).all()), "torch Reducer f32 mean: %s" % g1[0, :3])
        check(bool((g2 == (world + 1) / 2).all()), "torch Reducer f64 mean: %s" % g2[:3])
    print("rank %d: torch %s tensors checked" % (rank, torch.__version__), flush=True)


# ---------------------------------------------------------------- Reducer

MODEL = [1000, 7, 25000, 3, 7000, 1, 30001, 64]


def grads_for(rank, step):
    return [values(rank, n, "float32", 100 * step + k).astype(np.float32) for k, n in enumerate(MODEL)]


def reducer_checks(pg):
    world, rank = pg.size, pg.rank
    # Bucketed (several buckets, backward order) against a plain allreduce, sum and mean.
    for average in (False, True):
        grads = [np.zeros(n, np.float32) for n in MODEL]
        r = ddp.Reducer(pg, bucket_cap_bytes=32 * 1024, first_bucket_bytes=4 * 1024, average=average)
        for k, g in enumerate(grads):
            check(r.register(g) == k, "Reducer.register returned the wrong index")
        for step in range(2):
            src = grads_for(rank, step)
            for g, s in zip(grads, src):
                g[:] = s
            for k in reversed(range(len(grads))):
                r.mark_ready(k)
            r.finish()
            for k, s in enumerate(src):
                pg.allreduce(s, op="sum")
                if average:
                    s /= np.float32(world)
                    bad = np.abs(grads[k] - s) > 1e-6 * np.maximum(1.0, np.abs(s))
                else:
                    bad = grads[k] != s  # exact values: bit for bit
                check(not bad.any(), "Reducer (average=%s) step %d gradient %d differs from allreduce: "
                      "%d elements" % (average, step, k, int(bad.sum())))
        check(r.num_buckets > 2, "Reducer: %d buckets with a 32 KiB cap, want > 2" % r.num_buckets)

    # Gradients never marked count as ready; mixed dtypes get their own buckets.
    g32, g64 = np.full(100, rank, np.float32), np.full(10, rank, np.float64)
    r = ddp.Reducer(pg)
    r.register(g32)
    r.register(g64)
    r.mark_ready(1)
    r.finish()
    check(np.all(g32 == (world - 1) / 2) and np.all(g64 == (world - 1) / 2),
          "Reducer f32+f64, gradient 0 never marked: %r %r" % (g32[:2], g64[:2]))

    # no_sync: two micro-batches accumulate locally, the third syncs the sum.
    g = np.zeros(5000, np.float32)
    r = ddp.Reducer(pg)
    r.register(g)
    for micro in range(3):
        if micro < 2:
            with r.no_sync():
                g += rank + micro + 1
                r.mark_ready(0)
                r.finish()
            want_local = (micro + 1) * (rank + 1) + micro * (micro + 1) / 2
            check(np.all(g == want_local), "no_sync micro %d: %r, want the local %r" % (micro, g[0], want_local))
        else:
            g += rank + micro + 1
            r.mark_ready(0)
            r.finish()
    want = sum(3.0 * (q + 1) + 3.0 for q in range(world)) / world
    check(np.allclose(g, want, rtol=1e-6), "no_sync then sync: %r, want the mean %r" % (g[0], want))

    # Compression: within 2*n*u*sum|g_i/n| of the exact mean (docs/sdk.md).
    for comp, u in (("fp16", 2.0 ** -11), ("bf16", 2.0 ** -8)):
        vals = [values(q, 20000, "float32", 77) / 1000.0 for q in range(world)]
        g = vals[rank].astype(np.float32)
        r = ddp.Reducer(pg, compression=comp)
        r.register(g)
        r.mark_ready(0)
        r.finish()
        scaled = [v.astype(np.float32).astype(np.float64) / world for v in vals]
        exact = np.sum(scaled, axis=0)
        bound = 2.0 * world * u * np.sum(np.abs(scaled), axis=0) + 6e-8
        err = np.abs(g.astype(np.float64) - exact)
        check(np.all(err <= bound), "%s compression: %d elements beyond the bound (worst %.3g of it)" %
              (comp, int((err > bound).sum()), float(np.max(err / bound))))
        expect_error(lambda: ddp.Reducer(pg, compression=comp).register(np.zeros(3, np.float64)),
                     "f32 gradients only", "%s compression of an f64 gradient" % comp, code=1)

    # gradient_as_bucket_view: the trainer writes into gradient_buffer(i).
    if hasattr(ddp.Reducer, "gradient_buffer"):
        g0, g1 = np.zeros(300, np.float32), np.zeros((4, 5), np.float32)
        r = ddp.Reducer(pg, gradient_as_bucket_view=True)
        r.register(g0)
        r.register(g1)
        v0, v1 = r.gradient_buffer(0), r.gradient_buffer(1)
        check(v0.shape == (300,) and v1.shape == (4, 5) and v0.dtype == np.float32,
              "gradient_buffer shapes %s %s" % (v0.shape, v1.shape))
        for step in range(2):
            v0[:] = rank + step
            v1[:] = 10 * rank
            r.mark_ready(0)
            r.mark_ready(1)
            r.finish()
            check(np.all(v0 == (world - 1) / 2 + step) and np.all(v1 == 10 * (world - 1) / 2),
                  "gradient_as_bucket_view step %d: %r %r" % (step, v0[0], v1[0, 0]))
    else:
        fail("Reducer has no gradient_buffer(i): with gradient_as_bucket_view=True the averaged "
             "gradients land in a bucket Python cannot reach")

    # Misuse.
    a, b = np.zeros(10, np.float32), np.zeros(10, np.float32)
    r = ddp.Reducer(pg)
    r.register(a)
    if hasattr(ddp.Reducer, "gradient_buffer"):
        check(np.shares_memory(r.gradient_buffer(0), a), "gradient_buffer(0) without a view is not the array")
        expect_error(lambda: r.gradient_buffer(1), "", "gradient_buffer(1) of 1 gradient", code=1)
    r.mark_ready(0)
    expect_error(lambda: r.mark_ready(0), "twice", "Reducer.mark_ready twice in a step", code=1)
    r.finish()
    expect_error(lambda: r.register(b), "", "Reducer.register after the first step", code=5)
    expect_error(lambda: r.mark_ready(7), "", "Reducer.mark_ready(7) of 1 gradient", code=1)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    expect_error(lambda: ddp.Reducer(pg).register(ro), "read-only", "Reducer.register of a read-only array",
                 code=1)


def broadcast_parameters_checks(pg):
    world, rank = pg.size, pg.rank
    for root in sorted({0, world - 1}):
        w1 = np.full(1000, rank + 1, np.float32)
        w2 = np.full((3, 11), rank * 2.5, np.float64)
        w3 = np.full(5, rank - 7, np.int64)
        w4 = np.full(9, rank, np.float16)
        pg.broadcast_parameters([w1, w2, w3, w4], root=root)
        check(np.all(w1 == root + 1) and np.all(w2 == root * 2.5) and np.all(w3 == root - 7) and np.all(w4 == root),
              "broadcast_parameters from %d: %r %r %r %r" % (root, w1[0], w2[0, 0], w3[0], w4[0]))
    pg.broadcast_parameters([])  # nothing to do
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    expect_error(lambda: pg.broadcast_parameters([np.zeros(3, np.float32), ro]), "read-only",
                 "broadcast_parameters with a read-only array", code=1)


# ---------------------------------------------------------------- bad input

def bad_input_checks(pg):
    world = pg.size
    a = np.zeros(10, np.float32)
    expect_error(lambda: pg.allreduce(a[::2]), "not C-contiguous", "allreduce of a strided view", code=1)
    expect_error(lambda: pg.allreduce(np.zeros((4, 3), np.float32, order="F")), "not C-contiguous",
                 "allreduce of a Fortran-order array", code=1)
    expect_error(lambda: pg.allreduce(np.zeros(4, np.complex64)), "unsupported dtype complex64",
                 "allreduce of a complex64 array", code=1)
    expect_error(lambda: pg.allreduce(np.array([1, "x", None], dtype=object)), "unsupported dtype object",
                 "allreduce of an object array", code=1)
    expect_error(lambda: pg.allreduce(np.zeros(4, np.uint8)), "unsupported dtype uint8",
                 "allreduce of a uint8 array", code=1)
    expect_error(lambda: pg.allreduce(np.zeros(4, ">f4")), "unsupported dtype",
                 "allreduce of a big-endian float32 array", code=1)
    expect_error(lambda: pg.allreduce([1.0, 2.0]), "expected a numpy array", "allreduce of a list", code=1)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    expect_error(lambda: pg.allreduce(ro), "read-only", "allreduce of a read-only array", code=1)
    expect_error(lambda: pg.broadcast(ro), "read-only", "broadcast into a read-only array", code=1)
    expect_error(lambda: pg.allgather(np.zeros(3, np.float32), ro), "read-only",
                 "allgather into a read-only array", code=1)
    expect_error(lambda: pg.allgather(np.zeros(3, np.float32), np.zeros(3 * world + 1, np.float32)),
                 "world_size * len(in)", "allgather with an output one too long", code=1)
    expect_error(lambda: pg.allgather(np.zeros(3, np.float32), np.zeros(3 * world, np.float64)),
                 "world_size * len(in)", "allgather with an output of another dtype", code=1)
    expect_error(lambda: pg.reduce_scatter(np.zeros(3 * world + 1, np.int32), np.zeros(3, np.int32)),
                 "world_size * len(out)", "reduce_scatter with an input one too long", code=1)
    expect_error(lambda: pg.reduce_scatter(np.zeros(3 * world, np.int32), np.zeros(3, np.int64)),
                 "world_size * len(out)", "reduce_scatter with an output of another dtype", code=1)
    expect_error(lambda: pg.broadcast(a, root=world), "not a rank", "broadcast from root=world_size", code=1)
    expect_error(lambda: pg.broadcast(a, root=-1), "", "broadcast from root=-1", code=1)
    expect_error(lambda: pg.allreduce(a, op="mean"), "mean", "allreduce with op='mean'", code=1)
    expect_error(lambda: ddp.Reducer(pg, compression="int8"), "int8", "Reducer(compression='int8')", code=1)
    # The group still works after all that (nothing was sent).
    x = np.ones(3, np.float32)
    pg.allreduce(x)
    check(np.all(x == world), "allreduce after the bad calls: %r" % x)


def abort_checks(pg):
    """A second group, aborted: every later call raises a state error naming the
    reason; the first group goes on."""
    world = pg.size
    pg2 = ddp.init()
    x = np.ones(4, np.float32)
    pg2.allreduce(x)
    check(np.all(x == world), "second group's allreduce: %r" % x)
    g = np.zeros(4, np.float32)
    r2 = ddp.Reducer(pg2)
    r2.register(g)
    # Every rank is past pg2's allreduce before any aborts pg2: on the shared
    # memory path a rank still leaving a finished collective fails it when a
    # faster peer aborts the group right after (seen in ~15% of tries at 3 ranks).
    pg.barrier()
    pg2.abort("sdk_module_check abort")
    expect_error(lambda: pg2.allreduce(x), "sdk_module_check abort", "allreduce after abort", code=5)
    expect_error(lambda: pg2.barrier(), "sdk_module_check abort", "barrier after abort", code=5)
    expect_error(lambda: pg2.broadcast(x), "", "broadcast after abort", code=5)
    expect_error(lambda: pg2.allreduce(x, async_op=True), "", "async allreduce after abort", code=5)

    def reducer_step():
        r2.mark_ready(0)
        r2.finish()
    expect_error(reducer_step, "", "Reducer step on an aborted group", code=5)
    # Re-forming in place needs --restart_policy=inplace; a lost peer is code 8.
    expect_error(lambda: ddp.reconfigure(pg2), "--restart_policy=inplace",
                 "reconfigure outside --restart_policy=inplace", code=5)
    check(issubclass(ddp.PeerLostError, ddp.Error), "PeerLostError is not an Error")
    check(ddp.PeerLostError(8, "x").kind == "peer lost", "code 8's kind")
    del r2, pg2
    pg.barrier()  # the first group is untouched


def store_checks():
    """Which store (docs/sdk.md): with DDPRUN_TCPSTORE_ADDR (a single-node job; SDK_EXPECT_TCPSTORE=1
    says the test expects one) init() bootstrapped through ddprun's TCPStore, so ddprun, this
    worker's parent, has not loaded its gRPC module."""
    tcp = os.environ.get("DDPRUN_TCPSTORE_ADDR")
    if os.environ.get("SDK_EXPECT_TCPSTORE") == "1":
        check(tcp, "no DDPRUN_TCPSTORE_ADDR in a single-node job")
    if tcp:
        with open("/proc/%d/maps" % os.getppid()) as f:
            check("libddprun_grpc" not in f.read(), "ddprun loaded its gRPC module for the SDK")


# ---------------------------------------------------------------- main

def main():
    if "--outside" in sys.argv[1:]:
        outside()
    else:
        pg = ddp.init()
        world, rank = pg.size, pg.rank
        check(world == int(os.environ["WORLD_SIZE"]) and rank == int(os.environ["RANK"]),
              "rank/size %d/%d vs RANK/WORLD_SIZE %s/%s" % (rank, world, os.environ["RANK"], os.environ["WORLD_SIZE"]))
        check(pg.local_rank == int(os.environ["LOCAL_RANK"]), "local_rank %d" % pg.local_rank)
        check(pg.round == int(os.environ.get("DDPRUN_ROUND", "0")), "round %d" % pg.round)
        store_checks()
        shared = os.environ.get("SDK_CHECK_DIR")
        own = shared is None
        if own:
            shared = os.path.join(tempfile.gettempdir(), "sdk_module_check-" + os.environ.get("DDPRUN_JOB_ID", "x"))
            os.makedirs(shared, exist_ok=True)
        np_collectives(pg)
        barrier_checks(pg, shared)
        async_checks(pg)
        torch_checks(pg)
        reducer_checks(pg)
        broadcast_parameters_checks(pg)
        bad_input_checks(pg)
        abort_checks(pg)
        pg.barrier()
        if own and rank == 0:
            shutil.rmtree(shared, ignore_errors=True)
    who = "outside ddprun" if "--outside" in sys.argv[1:] else "rank %d" % RANK
    if FAILURES:
        print("%s: %d check(s) failed" % (who, len(FAILURES)), flush=True)
        sys.exit(1)
    print("%s: all checks passed" % who, flush=True)


if __name__ == "__main__":
    main()
