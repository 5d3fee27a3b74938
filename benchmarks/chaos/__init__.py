"""benchmarks/chaos.py's parts: the fleet it runs (fleet), what it sends (workload), what it breaks (faults), the
records both write (records) and what it proves from them (checker, redis_state)."""
