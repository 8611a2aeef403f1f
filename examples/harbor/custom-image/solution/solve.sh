#!/bin/bash
# The reference solution (Harbor's oracle agent runs it).
sed -i 's/Hello, world!/Hello from Rust!/' /app/hello/src/main.rs
