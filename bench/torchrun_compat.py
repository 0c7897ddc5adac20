"""Runs torch 1.13's torchrun (torch.distributed.run.main) on Python 3.11.

Debian 12's /usr/bin/torchrun crashes at every launch under Python 3.11
(pytorch#92319: Std.from_str iterates an IntFlag, which no longer yields the
zero member). This wrapper replaces Std.from_str with a parser of "0" and
"0:1,1:2" and then calls torchrun's main, so the peer can be measured here.
On torch >= 2.0 it changes nothing.
"""
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(vm):
    def to_std(v):
        return api.Std(int(v))

    if ":" not in vm and "," not in vm:
        return to_std(vm)
    out = {}
    for kv in vm.split(","):
        k, v = kv.split(":")
        out[int(k)] = to_std(v)
    return out


api.Std.from_str = staticmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
