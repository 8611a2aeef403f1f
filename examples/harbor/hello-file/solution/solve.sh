#!/bin/bash
# The reference solution (Harbor's oracle agent runs it).
echo "Hello, world!" > /app/hello.txt
