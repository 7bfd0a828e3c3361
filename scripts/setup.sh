#!/usr/bin/env bash
# Creates .venv and installs Janus with what this host needs. Idempotent: a stamp holding the hash of
# pyproject.toml skips the pip work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

need_ibverbs() { ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1'; }
if need_ibverbs; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "setup: installing libibverbs1 (the Mooncake transfer engine links against it)"
    apt-get install -y -q libibverbs1 >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libibverbs1 >/dev/null; }
  else
    echo "setup: the Debian package libibverbs1 is missing and this user cannot install it." >&2
    echo "       Ask an administrator for: sudo apt-get install libibverbs1   (Mooncake needs it), then rerun." >&2
    exit 1
  fi
fi

# Debian chromium: the status page is tested in headless Chromium (the test says so and skips without it)
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "setup: installing chromium (headless browser for the status-page test)"
  apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } \
    || echo "setup: chromium could not be installed; the status-page browser test will be skipped" >&2
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.janus-installed"
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi

pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: NVIDIA GPU found: CUDA torch, CUDA Mooncake"
  "${pip[@]}" torch
  extras="cuda,test"
else
  echo "setup: no GPU: CPU torch 2.13.0, Mooncake non-CUDA build"
  "${pip[@]}" torch==2.13.0
  extras="cpu,test"
fi
"${pip[@]}" -e ".[${extras}]"
echo "$want" > "$stamp"
echo "setup: done ($VENV)"
