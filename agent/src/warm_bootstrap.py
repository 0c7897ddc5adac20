# The warm standby's program (warm_standby.h; docs/recovery.md, "Warm start").
# The agent runs it as `PYTHON -u -c <this> SOCK_FD RESERVED MODULES`, with
# the job's environment, as its own child (process group, death signal and
# orphan guard as for a worker). It imports MODULES (comma-separated) and
# then waits on SOCK_FD for the rank it is to become; the agent then makes
# it that rank's worker: the environment, argv, output and inherited
# descriptors a cold start of the rank would have got, and the script run as
# __main__. It never runs anything else.
#
# Protocol on SOCK_FD (a Unix stream socket):
#   standby -> agent  b"R" + the modules that failed to import, comma-separated,
#                     + b"\n", once the imports are done;
#   agent -> standby  one message: a 4-byte big-endian length, then that many
#                     bytes of NUL-terminated fields (below), with descriptors
#                     attached (SCM_RIGHTS), one per target in "fds".
#   Fields: b"ddprun-warm-1", then sections, each a name, a count and that
#   many items: b"argv" (the worker's argv: PYTHON -u SCRIPT ARGS or
#   PYTHON -u -m MODULE ARGS), b"env" (KEY=VALUE, the whole environment),
#   b"cpus" (the CPU affinity, empty: unchanged), b"fds" (the descriptor
#   number each attached descriptor becomes: 1, 2, then the inherited ones).
# RESERVED (comma-separated descriptor numbers) are held on /dev/null from the
# start, so that nothing the imports open takes a number a worker inherits.
import os
import sys


def _reserve(numbers):
    held = []
    for fd in numbers:
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY)
            if null != fd:
                os.dup2(null, fd, inheritable=False)
                os.close(null)
            held.append(fd)
    return held


def _imports(modules):
    import importlib
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: the standby must stay usable
            failed.append("%s (%s: %s)" % (name, type(e).__name__, (str(e).splitlines() or [""])[0]))
    return failed


def _receive(sock):
    import array
    import socket
    import struct
    fds = array.array("i")
    data = b""
    need = None
    while need is None or len(data) < need:
        msg, anc, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(64 * fds.itemsize))
        if not msg:
            os._exit(0)  # the agent closed it without a rank: nothing to run
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        data += msg
        if need is None and len(data) >= 4:
            need = 4 + struct.unpack(">I", data[:4])[0]
    fields = data[4:need].split(b"\0")
    if fields[0] != b"ddprun-warm-1":
        os._exit(126)
    sections, i = {}, 1
    while i < len(fields) - 1:
        name, count = fields[i].decode(), int(fields[i + 1])
        sections[name] = fields[i + 2:i + 2 + count]
        i += 2 + count
    return sections, list(fds)


def _show_environ(items):
    """Writes the rank's environment over the one the standby was started
    with, in the area the kernel shows as /proc/<pid>/environ (as
    setproctitle does for the command line), so that tools reading it see
    the rank's, as for a cold start. The agent's DDPRUN_WARM_ROOM made room;
    nothing refers to the old strings once os.environ was replaced."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51
        data = b"".join(item + b"\0" for item in items)
        if not 0 < len(data) <= end - start:
            return
        import ctypes
        ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
    except Exception:
        pass  # only what other processes read changes


def _become(sections, fds, held, sock_fd):
    # Output first: whatever the rank prints goes where a cold start's would.
    sys.stdout.flush()
    sys.stderr.flush()
    targets = [int(t) for t in sections["fds"]]
    for fd, target in zip(fds, targets):
        os.dup2(fd, target, inheritable=True)
    for fd in fds:
        if fd not in targets:
            os.close(fd)
    for fd in held:
        if fd not in targets:
            os.close(fd)
    os.close(sock_fd)
    # Python picks line buffering at start from whether stdout is a terminal.
    if not sys.stdout.write_through:
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
    cpus = [int(c) for c in sections["cpus"]]
    if cpus:
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), cpus)
    os.environb.clear()
    for item in sections["env"]:
        key, _, value = item.partition(b"=")
        os.environb[key] = value
    _show_environ(sections["env"])
    argv = [os.fsdecode(a) for a in sections["argv"]]
    # ddprun's start-up hook (ddprun_hook/sitecustomize.py) found no metrics
    # file at the standby's start; with the rank's it installs now, and
    # patches the modules already imported.
    hook = sys.modules.get("sitecustomize")
    if hook is not None and hasattr(hook, "_install") and hasattr(hook, "_PATCHES"):
        try:
            hook._install()
        except Exception as e:
            sys.stderr.write("ddprun: the Python hook is off for this worker: %s\n" % e)
    import runpy
    rest = argv[argv.index("-u") + 1:]
    if rest[0] == "-m":
        sys.argv = ["-m"] + rest[2:]  # run_module puts the module's file first
        sys.path[0] = os.getcwd()
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        sys.path[0] = os.path.dirname(os.path.realpath(rest[0]))
        runpy.run_path(rest[0], run_name="__main__")


def _run(sections, fds, held, sock_fd):
    try:
        _become(sections, fds, held, sock_fd)
    except Exception as e:
        # As Python would print it for a cold start: from the script's first
        # frame on, without this program's and runpy's.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ("<string>", "<frozen runpy>"):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        raise SystemExit(1)


def _main():
    import socket
    sock_fd = int(sys.argv[1])
    held = _reserve([int(n) for n in sys.argv[2].split(",") if n])
    modules = [m for m in sys.argv[3].split(",") if m]
    sock = socket.socket(fileno=sock_fd)
    sock.set_inheritable(False)
    failed = _imports(modules)
    try:
        sock.sendall(b"R" + ",".join(failed).encode(errors="replace") + b"\n")
    except OSError:
        pass  # the agent handed a rank over before the imports were done, and closed its end
    sections, fds = _receive(sock)
    sock.detach()
    del sock
    _run(sections, fds, held, sock_fd)


_main()
