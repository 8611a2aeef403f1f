"""The sink: every topic into ClickHouse. `role.py` is its door; `sink.py` converts and stores
a poll's events; bus/heap.py returns the memory polls freed."""
