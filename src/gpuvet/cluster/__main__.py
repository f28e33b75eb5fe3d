"""`python -m gpuvet.cluster`: what torchrun and srun start on every node; with
`--cross-node-rank CONFIG`, one cross-node rank in a process of its own (started by cross.py)."""

import sys

from .command_line import command
from .cross_rank import child_main

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cross-node-rank":
        child_main(sys.argv[2])
    else:
        from ..cli.base import readable_anywhere

        readable_anywhere()  # an ASCII-only terminal gets stand-ins, not a UnicodeEncodeError
        command()
