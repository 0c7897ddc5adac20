"""Checkpoints in memory owned by ddprun's agent (docs/checkpoint.md).

    import ddprun.checkpoint as ckpt
    resumed = ckpt.load()                  # (step, state) or None
    if resumed:
        step, state = resumed
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    ...
    ckpt.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)

save() returns once the state is in the agent's memory for this worker
(the descriptor DDPRUN_CKPT_FD): it survives the worker's death and the
worker that replaces it finds it there. load() returns the newest step that
every rank of the job committed, the same on every rank. Tensors come back
on the device they were saved from, with their dtype and shape. The format
is this module's own (a JSON tree of key paths, dtypes, shapes and offsets,
then the raw bytes), never pickle.

Python with ctypes: PyTorch and numpy are imported only when the state
holds their objects; the bytes are copied and checksummed in one pass by
libddprun_worker_sdk.so when it is found (else memmove and zlib.crc32).
With that library, load() returns CPU tensors of 1 MiB or more mapped
copy-on-write from the snapshot instead of copied ("mapped tensors" below).
Not thread-safe: call it from one thread of the worker.
"""
import collections
import ctypes
import json
import mmap
import operator
import os
import signal
import struct
import sys
import time
import weakref
import zlib

from ddprun._fence import fence as _fence

__all__ = ["save", "load", "wait", "load_dir", "Error", "UnsupportedError"]

# The layout (rendezvous/common/include/ddprun/rendezvous/common/checkpoint_layout.h).
_MAGIC = b"DDPCKPT1"
_VERSION = 3
_HEADER_BYTES = 4096
_SLOTS_OFFSET = 12  # u32: the slot count, 2 (3 with --ckpt_replicas 1)
_MIN_SLOTS, _MAX_SLOTS = 2, 3
_CAPACITY_OFFSET = 16
_LIMIT_OFFSET = 24
_REPLICA_GATE_OFFSET = 32  # u64, written by the agent: 0 open, else 1 + the acknowledged generation
_RECORDS_OFFSET = 64
_RECORD_BYTES = 64
# state, checksum, generation, step, size, rank, world size, checksum kind
_RECORD = struct.Struct("<IIQqQiiI")
_CRC32, _CRC32C = 0, 1  # checksum kinds: zlib's CRC-32 (without the SDK library), CRC-32C
_EMPTY, _WRITING, _COMMITTED = 0, 1, 2
_ALIGN = 64
_FORMAT = 1  # of the snapshot bytes: u64 tree length, the JSON tree, the data

# Test hook (docs/checkpoint.md): "RANK:STEP" kills that rank with SIGKILL
# halfway through copying that step's snapshot, on the first attempt only.
_DIE_IN_SAVE = "DDPRUN_CKPT_TEST_DIE_IN_SAVE"

# How long a save waits for the replica of the snapshot it keeps (the layout's
# kEnvReplicaWait, kDefaultReplicaWaitSeconds, kReplicaWaitNoticeSeconds).
_REPLICA_WAIT = "DDPRUN_CKPT_REPLICA_WAIT"
_REPLICA_WAIT_DEFAULT = 60.0
_REPLICA_WAIT_NOTICE = 5.0


def _find_copier():
    """The SDK library's ddp_checkpoint_copy_crc32c (one pass that copies and
    checksums, CRC-32C in hardware), or None: then save and load copy with
    ctypes.memmove and checksum with zlib.crc32, a second pass. Looked for as
    ddprun_sdk.py looks for the library: DDPRUN_SDK_LIB, then beside this
    package (the wheel's ddprun/lib/, the build tree's python/ and lib/, an
    install's lib/), then the system's library path."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = [os.environ["DDPRUN_SDK_LIB"]] if os.environ.get("DDPRUN_SDK_LIB") else []
    for d in (os.path.join(here, "lib"), os.path.join(here, ".."),
              os.path.join(here, "..", "..", "lib"), os.path.join(here, "..", "..", "..")):
        names += [os.path.join(d, "libddprun_worker_sdk.so"),
                  os.path.join(d, "libddprun_worker_sdk.so.0")]
    names.append("libddprun_worker_sdk.so.0")
    for name in names:
        if os.path.sep in name and not os.path.exists(name):
            continue
        try:
            f = ctypes.CDLL(name).ddp_checkpoint_copy_crc32c
        except (OSError, AttributeError):
            continue  # another build's library, or one without the function
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32]
        f.restype = ctypes.c_uint32
        return f
    return None


_copier = False  # not looked for yet


def _copy_crc32c():
    global _copier
    if _copier is False:
        _copier = _find_copier()
    return _copier


class Error(RuntimeError):
    """A checkpoint could not be saved or loaded; the message says why and what to do."""


class UnsupportedError(Error, TypeError):
    """save() met an object it does not hold; the message names its key path."""


def _size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d bytes" % n


class _Memory:
    """This worker's checkpoint memory, mapped once for the process."""

    def __init__(self):
        text = os.environ.get("DDPRUN_CKPT_FD", "")
        if not text:
            raise Error("ddprun.checkpoint: this worker has no checkpoint memory (DDPRUN_CKPT_FD is "
                        "unset); run the script under ddprun, without --ckpt_shm_limit 0")
        try:
            fd = int(text)
            size = os.fstat(fd).st_size
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (ValueError, OSError) as e:
            raise Error("ddprun.checkpoint: DDPRUN_CKPT_FD=%s is not the agent's checkpoint memory "
                        "(%s); do not set DDPRUN_CKPT_FD yourself" % (text, e)) from None
        if size < _HEADER_BYTES or self.mm[:8] != _MAGIC or \
                struct.unpack_from("<I", self.mm, 8)[0] != _VERSION:
            raise Error("ddprun.checkpoint: DDPRUN_CKPT_FD=%s does not hold checkpoint memory of "
                        "version %d; use the ddprun this package came with" % (text, _VERSION))
        self.slots = struct.unpack_from("<I", self.mm, _SLOTS_OFFSET)[0]
        self.capacity, self.limit = struct.unpack_from("<QQ", self.mm, _CAPACITY_OFFSET)
        if not _MIN_SLOTS <= self.slots <= _MAX_SLOTS or \
                self.capacity > (size - _HEADER_BYTES) // self.slots or self.limit > self.capacity:
            raise Error("ddprun.checkpoint: DDPRUN_CKPT_FD=%s has a header that does not fit its "
                        "size; use the ddprun this package came with" % text)
        self.fd = fd
        self._anchor = ctypes.c_char.from_buffer(self.mm)  # the mapping lives as long as the process
        self.address = ctypes.addressof(self._anchor)

    def record(self, slot):
        return _RECORD.unpack_from(self.mm, _RECORDS_OFFSET + slot * _RECORD_BYTES)

    def replica_gate(self):
        """The agent's replica gate word (read until two reads agree: one 8-byte store)."""
        while True:
            a = struct.unpack_from("<Q", self.mm, _REPLICA_GATE_OFFSET)[0]
            if struct.unpack_from("<Q", self.mm, _REPLICA_GATE_OFFSET)[0] == a:
                return a

    def set_state(self, slot, state):
        struct.pack_into("<I", self.mm, _RECORDS_OFFSET + slot * _RECORD_BYTES, state)

    def data_offset(self, slot):
        return _HEADER_BYTES + slot * self.capacity


_memory = None


def _mem():
    global _memory
    if _memory is None:
        _memory = _Memory()
    return _memory


# ------------------------------------------------------------------ encoding

def _type_name(obj):
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else "%s.%s" % (t.__module__, t.__qualname__)


def _a(noun):
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _unsupported(path, obj, why=None):
    return UnsupportedError(
        "ddprun.checkpoint.save: %s is %s, which save does not hold; save holds torch tensors, "
        "numpy arrays, dicts, lists, tuples, str, bytes, int, float, bool and None: convert it "
        "(e.g. to a tensor, a dict or a list)" % (path, why or _a(_type_name(obj))))


class _Encoder:
    def __init__(self):
        self.blobs = []  # (offset in the data, nbytes, source address or bytes, keepalive)
        self.end = 0

    def _blob(self, nbytes, source, keep=None):
        off = self.end
        self.blobs.append((off, nbytes, source, keep))
        self.end = (off + nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        return off

    def encode(self, obj, path):
        if obj is None or isinstance(obj, (bool, str)) or type(obj) in (int, float):
            return {"t": "v", "v": obj}
        t = type(obj)
        if t is dict or t is collections.OrderedDict:
            items = []
            for k, v in obj.items():
                if not (k is None or isinstance(k, (str, bool)) or type(k) in (int, float)):
                    raise _unsupported("a key of %s" % path, k)
                items.append([k, self.encode(v, "%s[%r]" % (path, k))])
            node = {"t": "dict", "items": items}
            if t is collections.OrderedDict:
                node["ordered"] = True
            return node
        if t is list or t is tuple:
            return {"t": t.__name__, "v": [self.encode(v, "%s[%d]" % (path, i)) for i, v in enumerate(obj)]}
        if t is bytes or t is bytearray:
            return {"t": t.__name__, "off": self._blob(len(obj), bytes(obj)), "n": len(obj)}
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(torch, obj, path)
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, (np.ndarray, np.generic)):
            return self._array(np, obj, path)
        raise _unsupported(path, obj)

    def _tensor(self, torch, obj, path):
        if obj.layout != torch.strided:
            raise _unsupported(path, obj, "a tensor of layout %s" % obj.layout)
        if obj.is_quantized:
            raise _unsupported(path, obj, "a quantized tensor")
        cpu = obj.detach().to("cpu").contiguous()
        n = cpu.numel() * cpu.element_size()
        node = {"t": "torch", "dtype": str(cpu.dtype).replace("torch.", ""), "shape": list(cpu.shape),
                "device": str(obj.device), "off": self._blob(n, cpu.data_ptr(), cpu), "n": n}
        if isinstance(obj, torch.nn.Parameter):
            node["parameter"] = True
        if obj.requires_grad:
            node["requires_grad"] = True
        return node

    def _array(self, np, obj, path):
        scalar = isinstance(obj, np.generic)
        a = np.asarray(obj)  # not ascontiguousarray: it makes a 0-d array 1-d
        if not a.flags.c_contiguous:
            a = a.copy(order="C")
        if a.dtype.hasobject or a.dtype.fields is not None:
            raise _unsupported(path, obj, "a numpy array of dtype %s" % a.dtype)
        node = {"t": "numpy", "dtype": a.dtype.str, "shape": list(a.shape),
                "off": self._blob(a.nbytes, a.ctypes.data, a), "n": a.nbytes}
        if scalar:
            node["scalar"] = True
        return node


def _die_in_save_hook(step):
    spec = os.environ.get(_DIE_IN_SAVE, "")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return False
    rank, _, at = spec.partition(":")
    return rank == os.environ.get("RANK") and at == str(step)


def _every():
    try:
        return max(1, int(os.environ.get("DDPRUN_CKPT_EVERY", "1") or "1"))
    except ValueError:
        return 1


def _replica_wait_seconds():
    text = os.environ.get(_REPLICA_WAIT, "")
    try:
        seconds = float(text) if text else _REPLICA_WAIT_DEFAULT
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise Error("ddprun.checkpoint.save: %s=%r is not a number of seconds >= 0; unset it "
                    "(default %g) or fix it" % (_REPLICA_WAIT, text, _REPLICA_WAIT_DEFAULT))
    return seconds


def _await_replica(mem, generation, step):
    """With --ckpt_replicas 1, returns once the next node acknowledged the
    replica of this rank's previous snapshot (`generation`, committed before
    the one of `step`, whose transfer overlapped this step) or a newer one,
    or the agent opened the gate (no successor, or it cannot send to it), or
    DDPRUN_CKPT_REPLICA_WAIT passed (then one line says so). Generation 0 (no
    previous snapshot): at once."""
    gate = mem.replica_gate()
    if generation == 0 or gate == 0 or gate - 1 >= generation:
        return
    limit = _replica_wait_seconds()
    if limit == 0:
        return  # the user chose not to wait (docs/checkpoint.md, "Replica lag")
    t0 = time.monotonic()
    noticed = False
    pause = 0.0002
    while True:
        time.sleep(pause)
        pause = min(pause * 2, 0.002)
        gate = mem.replica_gate()
        if gate == 0 or gate - 1 >= generation:
            return
        waited = time.monotonic() - t0
        if waited >= limit:
            print("%s ddprun.checkpoint.save: the replica of the step before %d was not "
                  "acknowledged by the next node within %s=%g s; returning without it, so a loss "
                  "of this node now may leave no step in common (docs/checkpoint.md, "
                  "\"Replica lag\"); check the "
                  "next node or raise %s" % (_fence(), step, _REPLICA_WAIT, limit, _REPLICA_WAIT),
                  file=sys.stderr, flush=True)
            return
        if not noticed and waited >= _REPLICA_WAIT_NOTICE:
            noticed = True
            print("%s ddprun.checkpoint.save: step %d is saved here and waits for the replica of "
                  "the step before it to reach the next node (up to %s=%g s)"
                  % (_fence(), step, _REPLICA_WAIT, limit),
                  file=sys.stderr, flush=True)


def save(state, step):
    """Copies `state` into this worker's checkpoint memory as `step`.

    Returns True once the copy is committed: the snapshot then survives this
    process's death. The slot of the previous snapshot is not touched, so a
    save cut short leaves it loadable. With --ckpt_replicas 1 it returns once
    the next node also holds the replica of this rank's previous step (sent
    while this step computed; at most DDPRUN_CKPT_REPLICA_WAIT seconds;
    docs/checkpoint.md, "Replica lag").
    With --ckpt_every N, a step that is
    not a multiple of N is not saved: save returns False at once, without
    looking at `state`. Raises UnsupportedError naming the key path of an
    object it does not hold, Error when the snapshot is larger than
    --ckpt_shm_limit.
    """
    try:
        step = operator.index(step)
    except TypeError:
        raise Error("ddprun.checkpoint.save: step must be an int, got %s" % _type_name(step)) from None
    if not -(1 << 63) <= step < (1 << 63):
        raise Error("ddprun.checkpoint.save: step %d does not fit in 64 bits" % step)
    if step % _every() != 0:
        return False
    enc = _Encoder()
    tree = json.dumps({"format": _FORMAT, "state": enc.encode(state, "state")},
                      separators=(",", ":")).encode()
    mem = _mem()
    data_start = (8 + len(tree) + _ALIGN - 1) // _ALIGN * _ALIGN
    total = data_start + enc.end
    if total > mem.limit:
        raise Error("ddprun.checkpoint.save: the snapshot of step %d needs %s (%d bytes), more than "
                    "--ckpt_shm_limit (%s, %d bytes per worker); raise --ckpt_shm_limit (or "
                    "PET_CKPT_SHM_LIMIT) or save less" % (step, _size(total), total,
                                                          _size(mem.limit), mem.limit))
    # The oldest slot: one not committed (empty, or a save cut short) first,
    # else the committed one of the lowest generation; never the newest.
    records = [mem.record(s) for s in range(mem.slots)]
    committed = [s for s in range(mem.slots) if records[s][0] == _COMMITTED]
    free = [s for s in range(mem.slots) if records[s][0] != _COMMITTED]
    slot = free[0] if free else min(committed, key=lambda s: records[s][2])
    previous = max([records[s][2] for s in committed] or [0])
    generation = previous + 1
    _privatize(slot)  # loaded tensors still mapped over this slot keep what load returned
    mem.set_state(slot, _WRITING)  # from here the slot is not loadable until committed
    base = mem.data_offset(slot)
    mm = mem.mm
    struct.pack_into("<Q", mm, base, len(tree))
    mm[base + 8:base + 8 + len(tree)] = tree
    die = _die_in_save_hook(step)
    half = enc.end // 2
    copier = _copy_crc32c()
    crc, pos = 0, base  # with the copier: the CRC-32C of [base, pos), built as it copies
    for off, n, source, _ in enc.blobs:
        at = base + data_start + off
        if copier is not None:
            crc = copier(None, mem.address + pos, at - pos, crc)  # the tree, or padding
        if isinstance(source, bytes):
            mm[at:at + n] = source
            if copier is not None:
                crc = copier(None, mem.address + at, n, crc)
        elif n:
            if copier is not None:
                crc = copier(mem.address + at, source, n, crc)
            else:
                ctypes.memmove(mem.address + at, source, n)
        pos = at + n
        if die and off + n >= half:
            os.kill(os.getpid(), signal.SIGKILL)
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    if copier is not None:
        crc, kind = copier(None, mem.address + pos, base + total - pos, crc), _CRC32C
    else:
        view = memoryview(mm)[base:base + total]
        try:
            crc, kind = zlib.crc32(view), _CRC32
        finally:
            view.release()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rec = _RECORDS_OFFSET + slot * _RECORD_BYTES
    _RECORD.pack_into(mm, rec, _WRITING, crc, generation, step, total, rank, world, kind)
    mem.set_state(slot, _COMMITTED)  # the commit: last, one aligned 4-byte store
    _await_replica(mem, previous, step)  # the previous snapshot's replica
    return True


def wait():
    """Waits for outstanding background work of save(). This version does
    none (save copies before it returns), so wait() returns at once."""


# ------------------------------------------------------------------ loading

def _agreed_steps(local):
    """The steps every node's ranks all committed: this node's from the agent
    (DDPRUN_CKPT_STEPS), the others' through the round's TCPStore."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world == local_world:
        return local
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    try:
        import datetime
        import torch.distributed as dist
    except ImportError:
        raise Error("ddprun.checkpoint.load: agreeing on a step across nodes needs PyTorch's "
                    "TCPStore; install torch in the workers' environment") from None
    timeout = float(os.environ.get("DDPRUN_CKPT_AGREE_TIMEOUT", "300"))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                          datetime.timedelta(seconds=timeout))
    prefix = "ddprun_ckpt/%s/%s/" % (os.environ.get("DDPRUN_JOB_ID", ""), os.environ.get("DDPRUN_ROUND", ""))
    store.set(prefix + os.environ.get("GROUP_RANK", "0"), ",".join(str(s) for s in sorted(local)))
    common = set(local)
    held = []  # "node <g>: <steps>", for the line below
    for node in range(nodes):
        key = prefix + str(node)
        try:
            store.wait([key])
        except RuntimeError:
            raise Error("ddprun.checkpoint.load: node %d did not publish its checkpoint steps within "
                        "%g s; every rank must call load() at start" % (node, timeout)) from None
        text = store.get(key).decode()
        held.append("node %d: %s" % (node, text or "none"))
        common &= {int(s) for s in text.split(",") if s}
    # Steps exist but none is held by every node (a node restored from a peer
    # replica that was behind the others, say): the job starts over, which
    # must not pass in silence. Said once per node.
    if not common and os.environ.get("LOCAL_RANK", "0") == "0" and \
            any(not h.endswith(": none") for h in held):
        sys.stderr.write("%s ddprun.checkpoint.load: no step is held by every node (%s); starting "
                         "without a checkpoint (docs/checkpoint.md, \"No step in common\")\n"
                         % (_fence(), "; ".join(held)))
    return common


# ------------------------------------------------------------------ mapped tensors
#
# load() returns each CPU tensor of _MAP_MIN bytes or more as a private
# (copy-on-write) mapping of its bytes in the checkpoint memory instead of a
# copy: the pages are the snapshot's own, already in memory, so the restarted
# worker pays no page faults of fresh memory before training resumes. The
# tensor is still independent writable memory: a write to it copies the page
# it touches into the process (the snapshot is never changed), and before a
# later save() writes the slot the tensor was loaded from, _privatize copies
# every page of each such mapping still alive into the process, so that the
# tensor keeps the values load returned. Smaller tensors, numpy arrays and
# snapshots checksummed without the SDK library are copied as before.

_MAP_MIN = 1 << 20
_PAGE = mmap.PAGESIZE
_MADV_POPULATE_WRITE = 23  # Linux 5.14: write-fault every page of a range (breaks COW)
_mapped = []  # (slot, weakref to the mmap) of load()'s mappings that may still be alive
_madvise = False  # libc's madvise, not looked for yet; None where there is none


def _address(buf):
    """The address of a writable buffer's first byte (no reference kept)."""
    anchor = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def _libc_madvise():
    global _madvise
    if _madvise is False:
        try:
            _madvise = ctypes.CDLL(None, use_errno=True).madvise
            _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            _madvise = None
    return _madvise


def _privatize(slot):
    """Copies into this process every page of load()'s mappings of `slot`
    that are still alive (a loaded tensor, or a view of one, still held), so
    that writing the slot does not change them. One madvise per mapping
    (MADV_POPULATE_WRITE); on a kernel without it, a write of each page's
    first byte to itself does the same."""
    keep = []
    for s, ref in _mapped:
        m = ref()
        if m is None:
            continue
        if s != slot:
            keep.append((s, ref))
            continue
        madvise = _libc_madvise()
        if madvise is None or madvise(_address(m), len(m), _MADV_POPULATE_WRITE) != 0:
            for i in range(0, len(m), _PAGE):
                m[i] = m[i]
    _mapped[:] = keep


def _map(mem, slot, at, n):
    """A private writable mapping of the pages holding bytes [at, at + n) of
    the checkpoint memory, and the offset of byte `at` in it."""
    start = at // _PAGE * _PAGE
    m = mmap.mmap(mem.fd, at + n - start, flags=mmap.MAP_PRIVATE,
                  prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
    _mapped.append((slot, weakref.ref(m)))
    return m, at - start


def _allocate(node, copies, map_min=None):
    """Puts an empty CPU array of each tensor's and array's dtype and shape
    in node["_cpu"] and appends (offset, nbytes, its address, node) to
    copies; a tensor of map_min bytes or more (None: none) gets no array and
    None for its address: load maps it (see "mapped tensors")."""
    t = node["t"]
    if t == "dict":
        for _, v in node["items"]:
            _allocate(v, copies, map_min)
    elif t in ("list", "tuple"):
        for v in node["v"]:
            _allocate(v, copies, map_min)
    elif t == "torch":
        import torch
        if map_min is not None and node.get("n", 0) >= map_min:
            copies.append((node["off"], node["n"], None, node))
            return
        x = torch.empty(node["shape"], dtype=getattr(torch, node["dtype"]))
        node["_cpu"] = x
        if node.get("n", 0):
            copies.append((node["off"], node["n"], x.data_ptr(), node))
    elif t == "numpy":
        import numpy as np
        a = np.empty(node["shape"], dtype=np.dtype(node["dtype"]))
        node["_cpu"] = a
        if node.get("n", 0):
            copies.append((node["off"], node["n"], a.ctypes.data, node))


def _decode(node, mem, base):
    """The Python object of a tree node whose arrays _allocate made and
    whose bytes were copied into them (bytes objects are read from mem)."""
    t = node["t"]
    if t == "v":
        return node["v"]
    if t == "dict":
        d = collections.OrderedDict() if node.get("ordered") else {}
        for k, v in node["items"]:
            d[k] = _decode(v, mem, base)
        return d
    if t == "list":
        return [_decode(v, mem, base) for v in node["v"]]
    if t == "tuple":
        return tuple(_decode(v, mem, base) for v in node["v"])
    if t in ("bytes", "bytearray"):
        at, n = base + node.get("off", 0), node.get("n", 0)
        b = mem.mm[at:at + n]
        return bytes(b) if t == "bytes" else bytearray(b)  # bytes(bytes) does not copy
    if t == "torch":
        if "_map" in node:
            import torch
            m, delta = node.pop("_map")
            dtype = getattr(torch, node["dtype"])
            count = node["n"] // torch.empty((), dtype=dtype).element_size()
            x = torch.frombuffer(m, dtype=dtype, count=count, offset=delta).view(node["shape"])
        else:
            x = node.pop("_cpu")
        if node["device"] != "cpu":
            x = x.to(node["device"])
        if node.get("parameter"):
            import torch
            return torch.nn.Parameter(x, requires_grad=bool(node.get("requires_grad")))
        return x.requires_grad_(True) if node.get("requires_grad") else x
    if t == "numpy":
        a = node.pop("_cpu")
        return a[()] if node.get("scalar") else a
    raise Error("ddprun.checkpoint.load: unknown entry type %r in the snapshot" % t)


def _restore(tree, mem, base):
    """The state of a tree over data at mem.address + base, copied by memmove."""
    copies = []
    _allocate(tree, copies)
    for off, n, dst, _ in copies:
        ctypes.memmove(dst, mem.address + base + off, n)
    return _decode(tree, mem, base)


def load():
    """Returns (step, state) of the newest step that every rank of the job
    committed, the same step on every rank, or None when there is none (a
    fresh start). Every rank must call it (a job over several nodes agrees
    through the round's store). Call it at start, before the first save.
    Tensors of 1 MiB or more may be copy-on-write mappings of the snapshot:
    the caller's own memory all the same (see "mapped tensors")."""
    mem = _mem()
    local = {int(s) for s in os.environ.get("DDPRUN_CKPT_STEPS", "").split(",") if s}
    steps = _agreed_steps(local)
    if not steps:
        return None
    step = max(steps)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    found = [(rec[2], s, rec) for s, rec in ((s, mem.record(s)) for s in range(mem.slots))
             if rec[0] == _COMMITTED and rec[3] == step and rec[5] == rank and rec[6] == world]
    if not found:
        raise Error("ddprun.checkpoint.load: the snapshot of step %d is no longer in this worker's "
                    "memory (saved over since the worker started); call load() before save()" % step)
    _, slot, rec = max(found)
    base, size, kind = mem.data_offset(slot), rec[4], rec[7]
    if size < 8 or size > mem.capacity:
        raise Error("ddprun.checkpoint.load: the snapshot of step %d in memory is corrupt (its "
                    "recorded size is wrong); something other than ddprun.checkpoint wrote to "
                    "DDPRUN_CKPT_FD" % step)
    tree_len = struct.unpack_from("<Q", mem.mm, base)[0]
    data_start = (8 + tree_len + _ALIGN - 1) // _ALIGN * _ALIGN
    copier = _copy_crc32c()
    if kind == _CRC32C and copier is not None and data_start <= size:
        # One pass: each array's bytes are checksummed as they are copied
        # out, the tree and padding where they are; nothing is returned
        # unless the whole snapshot matches its record.
        tree = json.loads(bytes(mem.mm[base + 8:base + 8 + tree_len]))
        copies = []
        _allocate(tree["state"], copies, _MAP_MIN)
        crc, pos = 0, base
        for off, n, dst, node in sorted(copies, key=lambda c: c[0]):
            at = base + data_start + off
            if at < pos or at + n > base + size:
                raise Error("ddprun.checkpoint.load: the snapshot of step %d in memory is corrupt "
                            "(its tree places data outside it); something other than "
                            "ddprun.checkpoint wrote to DDPRUN_CKPT_FD" % step)
            crc = copier(None, mem.address + pos, at - pos, crc)
            if dst is None:  # mapped: checksummed through the mapping, whose pages it maps
                m, delta = _map(mem, slot, at, n)
                node["_map"] = (m, delta)
                crc = copier(None, _address(m) + delta, n, crc)
            else:
                crc = copier(dst, mem.address + at, n, crc)
            pos = at + n
        crc = copier(None, mem.address + pos, base + size - pos, crc)
        state = None
    elif kind == _CRC32:
        view = memoryview(mem.mm)[base:base + size]
        try:
            crc = zlib.crc32(view)
        finally:
            view.release()
        tree, state = None, True
    else:
        raise Error("ddprun.checkpoint.load: the snapshot of step %d has checksum kind %d, which "
                    "needs libddprun_worker_sdk.so and it was not found; set DDPRUN_SDK_LIB to it "
                    "(the build's lib/ or the install's lib/)" % (step, kind))
    if crc != rec[1]:
        raise Error("ddprun.checkpoint.load: the snapshot of step %d in memory is corrupt (checksum "
                    "%08x, recorded %08x); something other than ddprun.checkpoint wrote to "
                    "DDPRUN_CKPT_FD" % (step, crc, rec[1]))
    if state is None:
        return step, _decode(tree["state"], mem, base + data_start)
    tree = json.loads(bytes(mem.mm[base + 8:base + 8 + tree_len]))
    return step, _restore(tree["state"], mem, base + data_start)


# ------------------------------------------------------------------ --ckpt_dir

_MANIFEST_FORMAT = "ddprun-checkpoint-1"


class _FileView:
    """A persisted file's bytes with the address _restore copies from."""

    def __init__(self, data):
        self.mm = bytearray(data)
        self._anchor = (ctypes.c_char * len(self.mm)).from_buffer(self.mm)
        self.address = ctypes.addressof(self._anchor)


def _complete_steps(path):
    """{step: (world_size, {rank: entry})} of the complete steps in a --ckpt_dir."""
    steps = {}
    for name in os.listdir(path):
        if not name.startswith("step-"):
            continue
        try:
            step = int(name[5:])
        except ValueError:
            continue
        folder = os.path.join(path, name)
        world, ranks = None, {}
        for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            if not (f.startswith("manifest-") and f.endswith(".json")):
                continue
            try:
                with open(os.path.join(folder, f)) as fh:
                    m = json.load(fh)
            except (OSError, ValueError):
                continue
            if m.get("format") != _MANIFEST_FORMAT or m.get("step") != step:
                continue
            world = m.get("world_size")
            ranks.update({int(r): e for r, e in m.get("ranks", {}).items()})
        if world and all(r in ranks for r in range(world)):
            steps[step] = (world, ranks)
    return steps


def load_dir(path, rank=None, map_location=None):
    """Returns (step, state) of `rank` from the newest step that every rank
    has in a --ckpt_dir directory, or None when it holds no complete step.

    rank: default this worker's RANK, else 0. map_location: None puts each
    tensor back on the device it was saved from; "cpu" (or any device)
    puts them all there. Works without ddprun running: the files are
    safetensors (docs/checkpoint.md, "Persisted format"). A file whose size
    or CRC-32 does not match its manifest raises Error naming it.
    """
    steps = _complete_steps(path)
    if not steps:
        return None
    step = max(steps)
    world, ranks = steps[step]
    if rank is None:
        rank = int(os.environ.get("RANK", "0"))
    if rank not in ranks:
        raise Error("ddprun.checkpoint.load_dir: step %d in %s has ranks 0..%d, not %d"
                    % (step, path, world - 1, rank))
    entry = ranks[rank]
    file = os.path.join(path, "step-%d" % step, entry["file"])
    with open(file, "rb") as fh:
        data = fh.read()
    crc = zlib.crc32(data)
    if len(data) != entry["size"] or crc != entry["crc32"]:
        raise Error("ddprun.checkpoint.load_dir: %s is corrupt (%d bytes, CRC-32 %08x; its manifest "
                    "says %d bytes, %08x)" % (file, len(data), crc, entry["size"], entry["crc32"]))
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    meta = header.get("__metadata__", {})
    if meta.get("ddprun.format") != "1":
        raise Error("ddprun.checkpoint.load_dir: %s is not a ddprun checkpoint (no ddprun.format "
                    "in its __metadata__)" % file)
    tree = json.loads(meta["ddprun.tree"])

    def place(node):
        t = node.get("t")
        if t == "dict":
            for _, v in node["items"]:
                place(v)
        elif t in ("list", "tuple"):
            for v in node["v"]:
                place(v)
        elif "tensor" in node:
            node["off"] = header[node.pop("tensor")]["data_offsets"][0]
            if map_location is not None and t == "torch":
                node["device"] = str(map_location)

    place(tree["state"])
    return step, _restore(tree["state"], _FileView(data), 8 + n)
