#!/usr/bin/env bash
# Installs Debian's `prometheus` package when no `prometheus` binary is on PATH: the server that the
# real-Prometheus test (`python -m pytest -q -m prometheus`) starts on loopback. Idempotent; needs
# root for apt-get and downloads nothing but that package and its dependencies. The test runs its own
# prometheus on a free port with a generated config, so a packaged service the install may start
# does not get in its way. Exit 0: prometheus is there; 1: it could not be installed (said why).
set -euo pipefail

say() { echo "prometheus.sh: $*" >&2; }

if command -v prometheus >/dev/null 2>&1; then
    say "$(prometheus --version 2>&1 | head -n 1)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    say "error: prometheus is not installed and installing Debian's package needs root"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "error: prometheus is not installed and there is no apt-get here (install Prometheus >= 2 by other means)"
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y -q --no-install-recommends prometheus >&2; }
if ! install; then
    say "refreshing the package lists"
    apt-get update -q >&2 || true
    if ! install; then
        say "error: apt-get could not install the prometheus package"
        exit 1
    fi
fi
say "$(prometheus --version 2>&1 | head -n 1)"
