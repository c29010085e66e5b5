#!/usr/bin/env python3
"""`mhar-train-ddp` from a checkout, without installing the package: Python puts this file's
folder, python/, first on the import path, so `mhar_torch` is found there. The trainer itself is
mhar_torch/train_ddp.py.

    python3 python/train_ddp.py --mode mhar --steps 300 --out runs/py
    python3 python/torchrun_compat.py --nproc_per_node 2 python/train_ddp.py --out runs/ddp2
"""

import sys

from mhar_torch.train_ddp import main

if __name__ == "__main__":
    sys.exit(main())
