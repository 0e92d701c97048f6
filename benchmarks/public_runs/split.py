"""The calibration / held-out split of runs.yaml, fixed before any fit.

- The 49 rows of issue 25 (`ISSUE25_IDS`) keep the split written next to them in runs.yaml, chosen by hand
  before the first fit (README.md, "Calibration and held-out split").
- Every row added after them (issue 29 on) takes `hashed_split(id)`: held out when the first byte of the
  SHA-256 of its id is divisible by 3 (about one row in three), calibration otherwise. The rule was committed
  before the first of those rows was written and before any re-fit, so no row's split depends on how well the
  model predicts it. tests/test_public_runs_data.py holds every new row to it.

No torch, no nanoplan.
"""

from __future__ import annotations

import hashlib

HELD_OUT_EVERY = 3      # one row in three is held out

ISSUE25_IDS = frozenset("""
nanochat-d20-h100x8-b32 nanochat-d32-h100x8-b8 nanochat-d32-h100x8-b16-oom nanochat-d20-a100x8-b32
nanochat-d20-h100x8-b32-jan26-oom moddednanogpt-124m-h100x8-b64 moddednanogpt-1p5b-h100x8-b12
torchtitan-llama3-8b-h100x8-fsdp torchtitan-llama3-8b-h100x8-fsdp-compile torchtitan-llama3-8b-h100x8-fsdp-compile-fp8
torchtitan-llama3-8b-h100x128-fsdp torchtitan-llama3-8b-h100x128-fsdp-compile
torchtitan-llama3-8b-h100x128-fsdp-compile-fp8 torchtitan-llama3-70b-h100x256-fsdp-tp8-compile-fp8
torchtitan-llama3-8b-a100x64-selop torchtitan-llama3-8b-a100x64-sellayer torchtitan-llama3-70b-a100x64-full
torchtitan-llama2-13b-a100x64-noac torchtitan-llama2-70b-a100x64-b2-full torchtitan-llama2-70b-a100x64-b2-sellayer-oom
torchtitan-llama2-70b-a100x64-b2-selop-oom torchtitan-llama3-8b-h200x32-fsdp-compile-fp8
torchtitan-llama3-8b-h200x64-fsdp-compile-fp8 torchtitan-llama3-8b-b200x8-fsdp-compile
torchtitan-llama3-8b-b200x8-fsdp-compile-fp8 llmfoundry-mpt-760m-h100x8-t2048-mb24 llmfoundry-mpt-1b-h100x8-t2048-mb14
llmfoundry-mpt-7b-h100x8-t2048-mb6 llmfoundry-mpt-7b-h100x8-t4096-mb16 llmfoundry-mpt-13b-h100x8-t2048-mb2
llmfoundry-mpt-30b-h100x8-t2048-mb3 llmfoundry-mpt-3b-h100x16-t2048-mb10 llmfoundry-mpt-13b-h100x64-t2048-mb2
llmfoundry-mpt-70b-h100x64-t2048-mb8 llmfoundry-mpt-7b-h100x128-t2048-mb6 llmfoundry-mpt-1b-h100x512-t2048-mb12
llmfoundry-mpt-3b-h100x8-t2048-mb10-fp8 llmfoundry-mpt-125m-a100-80gx8-t2048-mb32 llmfoundry-mpt-1b-a100-80gx8-t2048-mb14
llmfoundry-mpt-7b-a100-80gx8-t2048-mb6 llmfoundry-mpt-13b-a100-80gx8-t2048-mb2 llmfoundry-mpt-30b-a100-80gx8-t2048-mb3
llmfoundry-mpt-70b-a100-80gx64-t2048-mb8 llmfoundry-mpt-125m-a100-40gx8-t2048-mb26 llmfoundry-mpt-3b-a100-40gx8-t2048-mb5
llmfoundry-mpt-7b-a100-40gx8-t2048-mb12 llmfoundry-mpt-1b-a100-40gx64-t2048-mb10 llmfoundry-mpt-13b-a100-40gx32-t2048-mb14
llmfoundry-mpt-30b-a100-40gx128-t2048-mb6
""".split())


def hashed_split(row_id: str) -> str:
    """'heldout' or 'calibration' for a row added after issue 25, from its id alone."""
    first = hashlib.sha256(row_id.encode("utf-8")).digest()[0]
    return "heldout" if first % HELD_OUT_EVERY == 0 else "calibration"


def expected_split(row_id: str, written: str) -> str:
    """The split a row must have: what runs.yaml says for issue 25's rows, the hash for every later one."""
    return written if row_id in ISSUE25_IDS else hashed_split(row_id)
