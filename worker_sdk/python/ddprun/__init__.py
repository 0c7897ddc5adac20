"""ddprun for Python: the worker SDK, and the launcher when installed from the wheel.

    import ddprun
    pg = ddprun.init()        # the SDK (ddprun_sdk): reads ddprun's environment
    ddprun.step(samples=64)   # live metrics for ddprun's monitoring

Importing this package is cheap and works everywhere: the SDK (ddprun_sdk,
which stays importable under that name) is loaded on the first use of one of
its names, so outside a ddprun job the error is the SDK's own (ddprun.init()
raises ddprun_sdk.Error naming the missing environment), never a missing
library at import time. `python -m ddprun ...` is the `ddprun` command.
Other modules of this folder (e.g. ddprun.checkpoint) are imported by name.
"""

__all__ = ["init", "step", "scalar", "ProcessGroup", "Reducer", "Work", "Error", "TimeoutError_",
           "DTYPES", "OPS"]


def __getattr__(name):
    # PEP 562: the SDK's names, resolved once on first use.
    if name in __all__:
        import ddprun_sdk  # the wheel puts it on sys.path (ddprun.pth); a build tree's python/
        value = getattr(ddprun_sdk, name)
        globals()[name] = value
        return value
    raise AttributeError("module 'ddprun' has no attribute %r" % name)


def __dir__():
    return sorted(list(globals()) + __all__)
