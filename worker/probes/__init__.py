"""What measures or emulates a worker without changing what it trains: the benchmarks' CPU-parts
audit (cpu_parts.py: one probe, chosen once, that does nothing unless asked), a slower machine
emulated around a step's compute (resources.py: --slowdown, burned CPU), and the stall hook the chaos
benchmark drives (stall_hook.py). Leaves: they import nothing of the project."""
