"""Running a server process, apart from what it serves: the JSON-lines metrics log, stack dumps on
SIGUSR1, glibc malloc tuning, the port file, argparse types for numbers and addresses. Imports
nothing of ps, so every server and worker process can use it."""
