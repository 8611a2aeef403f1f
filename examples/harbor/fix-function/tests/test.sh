#!/bin/bash
# The verifier: checks /app/mathlib.py and writes reward.json (the reward, and the cases passed
# and failed as further metrics).
cd /app
python3 /tests/check_median.py
