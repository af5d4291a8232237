# SPDX-License-Identifier: Apache-2.0
"""meson's entry to test_frameworks.py: exit 77 (skipped) when neither Accelerate nor Lightning
is installed, pytest's own status otherwise."""

import importlib.util
import os
import sys

if not any(importlib.util.find_spec(m) for m in ("accelerate", "lightning", "pytorch_lightning")):
    print("skipped: neither Hugging Face Accelerate nor PyTorch Lightning is installed")
    sys.exit(77)
import pytest  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs",
                      os.path.join(here, "test_frameworks.py")]))
