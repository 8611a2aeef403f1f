#!/bin/bash
# The verifier: builds and runs the agent's program in the task's image.
cd /app/hello
if [ "$(cargo run --quiet 2>/dev/null)" = "Hello from Rust!" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
