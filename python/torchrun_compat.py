#!/usr/bin/env python3
"""torchrun, for PyTorch 1.13 on Python 3.11 and later (Debian 12's python3-torch).

There `torchrun` stops before starting any worker with
    AttributeError: 'NoneType' object has no attribute 'get'
because Python 3.11 no longer lists the zero-valued member of a Flag enum when it is iterated,
and torch 1.13's Std.from_str("0") (the default of --redirects and --tee) looks the value up by
iterating Std. PyTorch 2.0 builds the member with Std(int(v)) instead; this script makes that one
change, only where the lookup is broken, and then runs torch.distributed.run unchanged, with the
same arguments:

    python3 python/torchrun_compat.py --nproc_per_node 2 python/train_ddp.py ...

When a worker fails, it prints one line naming the failed ranks and exits with the worker's
status, where torchrun prints its own traceback.
"""

import sys


def _patch():
    from torch.distributed.elastic.multiprocessing import api

    if api.Std.from_str("0") is not None:
        return  # this torch and Python agree: nothing to mend
    original = api.Std.from_str.__func__

    def from_str(cls, vm):
        import re
        if re.match(api._VALUE_REGEX, vm):
            return cls(int(vm))
        if re.match(api._MAPPING_REGEX, vm):
            return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
        return original(cls, vm)  # raises the usual error for anything else

    api.Std.from_str = classmethod(from_str)


if __name__ == "__main__":
    try:
        import torch.distributed.run as run
    except ImportError as e:
        print("torchrun_compat.py: cannot import torch.distributed.run (%s)" % e, file=sys.stderr)
        sys.exit(4)
    _patch()
    sys.argv[0] = "torchrun"
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    try:
        sys.exit(run.main())
    except ChildFailedError as e:
        # torchrun reports a worker that exited non-zero with its own traceback; the worker has
        # already printed its message (train_ddp.py: one line), so say which one failed and
        # pass its exit status on
        codes = {rank: f.exitcode for rank, f in sorted(e.failures.items())}
        print("torchrun: %s exited %s (its message is above)"
              % (", ".join("rank %d" % r for r in codes), ", ".join(str(c) for c in codes.values())),
              file=sys.stderr)
        first = next(iter(codes.values()))
        sys.exit(first if isinstance(first, int) and 0 < first < 256 else 1)
