"""`python -m gpuvet.cluster`: what torchrun and srun start on every node; with
`--cross-node-rank CONFIG`, one cross-node rank in a process of its own (started by cross.py)."""

import sys

from .cross_rank import child_main

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cross-node-rank":
        child_main(sys.argv[2])
    else:
        # The entry point is the command's (the one import of cli/ in this package, declared in the
        # import contracts): click options, the store and the report live above the cluster.
        from ..cli.base import readable_anywhere
        from ..cli.cluster import command

        readable_anywhere()  # an ASCII-only terminal gets stand-ins, not a UnicodeEncodeError
        command()
