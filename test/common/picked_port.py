# SPDX-License-Identifier: Apache-2.0
"""A port for a job a test starts by hand (MASTER_PORT, --rdzv-endpoint): horarun's own pick
(tools/horarun_lib/ports.py), below the kernel's ephemeral range and locked against other picks,
so no test running beside this one can take it before the job binds it."""

import os
import sys

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "horarun_lib")


def free_port(addr="127.0.0.1"):
    if _LIB not in sys.path:
        sys.path.insert(0, _LIB)
    import ports  # pylint: disable=import-outside-toplevel
    return ports.free_port(addr)
