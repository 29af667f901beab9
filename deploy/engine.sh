#!/usr/bin/env bash
# A Docker engine, compose v2 and the hetero-ps image on a Debian machine, from Debian's packages
# only (no image registry needed). Idempotent: each step does only what is missing. Run as root.
#
#   deploy/engine.sh           # the engine and compose v2, then the image from the working tree
#   deploy/engine.sh engine    # only the engine and compose v2
#   deploy/engine.sh status    # one line: the engine, compose and the image, or what is missing
#
# Engine: where `docker info` fails, installs docker.io, containerd and runc with apt, and compose
# v2 and buildx from the docker-compose and docker-buildx packages of Debian's next release (each
# a static binary that only needs libc) where `docker compose version` fails; then starts dockerd
# WITHOUT its default bridge and without touching iptables or IP forwarding ("bridge": "none" in
# /etc/docker/daemon.json, written when the file is absent), so containers run with host
# networking (deploy/docker-compose.host.yml) and every packet stays on this machine's loopback.
#
# Image: builds $PS_IMAGE from deploy/Dockerfile (every run: the layer cache makes a rebuild after a
# code change take seconds, and the image always holds the working tree) with the build network of the host. The base is
# $PS_BASE_IMAGE when present or pullable, else a local Debian image made with debootstrap and
# `docker import` ($PS_LOCAL_BASE), which carries this machine's CA certificates (pip inside the
# build verifies the package index with them, as the host's pip does). torch comes from a local
# wheel folder when one holds a torch wheel (served to the build on 127.0.0.1), else from the
# public CPU index.
#
# Environment (defaults in brackets):
#   PS_IMAGE [hetero-ps:local]            the image to build
#   PS_BASE_IMAGE [python:3.11-slim]      the usual base image
#   PS_LOCAL_BASE [hetero-ps-base:bookworm]  the debootstrap base, built when the usual one is missing
#   PS_TORCH_FIND_LINKS [the host pip's find-links folder that holds a torch wheel, if any]
#   PS_TORCH_INDEX_URL [https://download.pytorch.org/whl/cpu; "" when a wheel folder is used]
#   PS_DEBIAN_MIRROR [http://deb.debian.org/debian]   for debootstrap and the next release's packages
#   PS_COMPOSE_SUITE [trixie]             the Debian suite compose v2 and buildx come from
#   PS_WHEEL_PORT [38871]                 the loopback port the wheel folder is served on (a fixed
#                                         one keeps the torch layer cached; another if it is taken)
#   PS_DOCKERD_LOG [/var/log/hetero-ps-dockerd.log]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PS_IMAGE="${PS_IMAGE:-hetero-ps:local}"
PS_BASE_IMAGE="${PS_BASE_IMAGE:-python:3.11-slim}"
PS_LOCAL_BASE="${PS_LOCAL_BASE:-hetero-ps-base:bookworm}"
PS_DEBIAN_MIRROR="${PS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PS_COMPOSE_SUITE="${PS_COMPOSE_SUITE:-trixie}"
PS_DOCKERD_LOG="${PS_DOCKERD_LOG:-/var/log/hetero-ps-dockerd.log}"
PS_WHEEL_PORT="${PS_WHEEL_PORT:-38871}"
DAEMON_JSON=/etc/docker/daemon.json

say() { echo "engine.sh: $*" >&2; }
die() { echo "engine.sh: error: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts dockerd)"
}

engine_up() { docker info >/dev/null 2>&1; }
compose_up() { docker compose version >/dev/null 2>&1; }
buildx_up() { docker buildx version >/dev/null 2>&1; }

apt_install() {
    # apt-get update once per run, then install the named packages without recommends.
    if [ -z "${_APT_UPDATED:-}" ]; then
        apt-get update -q >/dev/null
        _APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

install_from_next_release() {
    # Download packages of $PS_COMPOSE_SUITE with a private apt state (the system's sources stay as
    # they are) and install the .debs; they depend on libc only.
    local state
    state="$(mktemp -d)"
    trap 'rm -rf "$state"; trap - RETURN' RETURN
    mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    echo "deb [signed-by=$keyring] $PS_DEBIAN_MIRROR $PS_COMPOSE_SUITE main" >"$state/sources.list"
    local options=(-o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
                   -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
                   -o Dir::State::status=/dev/null -o APT::Sandbox::User=root)
    apt-get "${options[@]}" update -q >/dev/null
    (cd "$state" && apt-get "${options[@]}" download "$@" >/dev/null)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$state"/*.deb >/dev/null
}

write_daemon_config() {
    if [ ! -e "$DAEMON_JSON" ]; then
        mkdir -p "$(dirname "$DAEMON_JSON")"
        cat >"$DAEMON_JSON" <<'JSON'
{
  "bridge": "none",
  "iptables": false,
  "ip-forward": false,
  "ip-masq": false
}
JSON
        say "wrote $DAEMON_JSON (no default bridge, iptables untouched)"
    elif ! python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("bridge") != "none")' "$DAEMON_JSON"; then
        die "$DAEMON_JSON does not say \"bridge\": \"none\"; add it (this script never starts the default bridge)"
    fi
}

start_dockerd() {
    if [ -d /run/systemd/system ] && systemctl start docker 2>/dev/null; then
        say "started docker.service"
    else
        say "starting dockerd (log: $PS_DOCKERD_LOG)"
        setsid dockerd >>"$PS_DOCKERD_LOG" 2>&1 </dev/null &
    fi
    local waited=0
    until engine_up; do
        sleep 0.5
        waited=$((waited + 1))
        if [ "$waited" -ge 120 ]; then
            die "dockerd did not answer within 60 s; last log line: $(tail -n 1 "$PS_DOCKERD_LOG")"
        fi
    done
}

ensure_engine() {
    if ! engine_up; then
        need_root
        # The config comes first: a package's postinst may start dockerd, and it must start without a bridge.
        write_daemon_config
        if ! command -v dockerd >/dev/null 2>&1; then
            say "installing docker.io, containerd, runc"
            apt_install docker.io containerd runc
        fi
        engine_up || start_dockerd
    fi
    if ! compose_up || ! buildx_up; then
        need_root
        say "installing compose v2 and buildx from Debian $PS_COMPOSE_SUITE"
        install_from_next_release docker-compose docker-buildx
        compose_up || die "docker compose still does not run after installing docker-compose from $PS_COMPOSE_SUITE"
    fi
}

image_present() { docker image inspect "$1" >/dev/null 2>&1; }

build_local_base() {
    # A minimal Debian with Python 3.11 and venv, and this machine's CA certificates.
    need_root
    command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
    local root
    root="$(mktemp -d)"
    trap 'rm -rf "$root"; trap - RETURN' RETURN
    say "building $PS_LOCAL_BASE with debootstrap (about a minute)"
    if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$root" "$PS_DEBIAN_MIRROR" >"$root.log" 2>&1; then
        local last
        last="$(tail -n 1 "$root.log")"
        rm -rf "$root" "$root.log"
        die "debootstrap failed; last line: $last"
    fi
    rm -f "$root.log"
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        # the caller's TMPDIR (a test suite's own folder, say) does not exist inside the new root
        local out
        out="$(TMPDIR=/tmp chroot "$root" update-ca-certificates 2>&1)" \
            || die "update-ca-certificates failed in the new root: ${out##*$'\n'}"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import \
        --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change 'CMD ["python3"]' - "$PS_LOCAL_BASE" >/dev/null
}

choose_base() {
    # Prints the base image to build from.
    if image_present "$PS_BASE_IMAGE" || docker pull -q "$PS_BASE_IMAGE" >/dev/null 2>&1; then
        echo "$PS_BASE_IMAGE"
        return
    fi
    say "$PS_BASE_IMAGE cannot be pulled; using $PS_LOCAL_BASE"
    image_present "$PS_LOCAL_BASE" || build_local_base
    echo "$PS_LOCAL_BASE"
}

torch_wheel_folder() {
    # The folder of the host pip's find-links (or $PS_TORCH_FIND_LINKS) that holds a torch wheel.
    local folders="${PS_TORCH_FIND_LINKS-}"
    if [ -z "${PS_TORCH_FIND_LINKS+set}" ]; then
        folders="${PIP_FIND_LINKS:-} $(pip3 config get global.find-links 2>/dev/null || true)"
    fi
    local folder
    for folder in $folders; do
        folder="${folder#file://}"
        if [ -d "$folder" ] && compgen -G "$folder/torch-*.whl" >/dev/null; then
            echo "$folder"
            return
        fi
    done
}

serve_folder() {
    # Serve a folder on 127.0.0.1 in the background; prints "PID PORT".
    local port
    port="$(python3 -c '
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' "$PS_WHEEL_PORT")"
    python3 -m http.server --bind 127.0.0.1 --directory "$1" "$port" >/dev/null 2>&1 &
    local pid=$!
    local tries=0
    until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "http://127.0.0.1:$port/" 2>/dev/null; do
        sleep 0.2
        tries=$((tries + 1))
        [ "$tries" -lt 50 ] || { kill "$pid"; die "could not serve $1 on 127.0.0.1:$port"; }
    done
    echo "$pid $port"
}

build_image() {
    local base folder find_links="" index_url server_pid=""
    base="$(choose_base)"
    index_url="${PS_TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
    folder="$(torch_wheel_folder)"
    if [ -n "$folder" ]; then
        local served
        served="$(serve_folder "$folder")"
        server_pid="${served% *}"
        find_links="http://127.0.0.1:${served#* }/"
        index_url="${PS_TORCH_INDEX_URL-}"
        say "torch from $folder (served on $find_links for the build)"
    fi
    say "building $PS_IMAGE from $base"
    local status=0
    docker build --network host -f "$REPO/deploy/Dockerfile" -t "$PS_IMAGE" \
        --build-arg "BASE_IMAGE=$base" --build-arg "TORCH_INDEX_URL=$index_url" \
        --build-arg "TORCH_FIND_LINKS=$find_links" "$REPO" || status=$?
    [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
    [ "$status" -eq 0 ] || die "docker build failed (exit $status)"
    # the image this build replaced, now untagged (its layers below the code stay, shared)
    docker image prune -f --filter label=org.opencontainers.image.title=hetero-ps >/dev/null
    say "built $PS_IMAGE"
}

status_line() {
    local engine=down compose=missing image=missing
    engine_up && engine="up ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
    compose_up && compose="$(docker compose version --short 2>/dev/null)"
    engine_up && image_present "$PS_IMAGE" && image="$PS_IMAGE"
    echo "engine: $engine; compose: $compose; image: $image"
}

case "${1:-all}" in
    all) ensure_engine; build_image; status_line ;;
    engine) ensure_engine; status_line ;;
    status) status_line; engine_up && compose_up ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) echo "engine.sh: error: unknown command '$1' (all, engine, status)" >&2; exit 2 ;;
esac
