"""Running any process of the service, server or worker: argparse types for numbers and addresses,
glibc malloc tuning, the memory a process may still take, stack dumps on SIGUSR1. Imports nothing of
the project."""
