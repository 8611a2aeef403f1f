"""Checks the agent's median(): reward 1 when every case passes, else 0; the counts go beside it
in reward.json."""

import json
import sys

sys.path.insert(0, "/app")
CASES = [([3, 1, 2], 2), ([4, 1, 3, 2], 2.5), ([5], 5), ([1.5, 0.5], 1.0), ([7, 7, 1, 9], 7)]

try:
    from mathlib import median
except Exception as exc:  # an agent may have broken the file
    print(f"cannot import mathlib: {exc!r}")
    median = None

passed = 0
for values, expected in CASES:
    try:
        got = median(list(values)) if median is not None else None
    except Exception as exc:
        got = repr(exc)
    ok = got == expected
    passed += ok
    print(f"{'PASS' if ok else 'FAIL'} median({values}) = {got!r}, expected {expected!r}")

result = {"reward": float(passed == len(CASES)), "passed": passed, "failed": len(CASES) - passed}
with open("/logs/verifier/reward.json", "w") as f:
    json.dump(result, f)
