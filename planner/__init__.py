"""nanoplan planner: pure-Python model maths, memory model, budget and plan schema.

Importing this package must never import torch (tests/test_no_torch.py checks it).
"""

__version__ = "0.1.0"
