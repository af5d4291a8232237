# SPDX-License-Identifier: Apache-2.0
"""One factor for every time limit in the tests: HORA_TEST_TIME_SCALE (default 1).

A loaded machine stretches how long correct work takes, never what it produces. Every limit a test
waits up to (a watchdog, a deadline, hora's own HORA_TIMEOUT_S in a test job) is written for a quiet
machine and passed through scaled(); lower bounds are never scaled. Import with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
"""

import os
import sys


def _factor():
    text = os.environ.get("HORA_TEST_TIME_SCALE", "")
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1.0:
        sys.stderr.write("HORA_TEST_TIME_SCALE=%s: want a number >= 1; using 1\n" % text)
        return 1.0
    return value


SCALE = _factor()


def scaled(seconds):
    """`seconds` on a quiet machine, stretched by the factor."""
    return seconds * SCALE
