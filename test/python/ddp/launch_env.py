# SPDX-License-Identifier: Apache-2.0
"""torch's env:// variables for a rank that mpirun started (horarun and torchrun set them)."""

import os


def fill():
    """MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from Open MPI's variables where missing.
    The port must be the same on every rank: the test passes MASTER_PORT through mpirun."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK")
    size = os.environ.get("OMPI_COMM_WORLD_SIZE")
    if rank is None or size is None:
        return
    os.environ.setdefault("RANK", rank)
    os.environ.setdefault("WORLD_SIZE", size)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
