#!/usr/bin/env bash
# Installs what the report's browser test (tests/report_browser.rs) needs on Debian/Ubuntu:
# Chromium, which the test runs headless to open `shardc report`'s page. Idempotent: installs
# only what is missing and exits 0 when it is already there.
#
# Usage: scripts/install-chromium.sh
set -euo pipefail

packages=(chromium)

missing=()
for p in "${packages[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        echo "install-chromium: $p is already installed"
    else
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-chromium: apt-get not found; install ${missing[*]} with your package manager" >&2
        exit 1
    fi
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "install-chromium: not root and sudo not found; cannot install ${missing[*]}" >&2
            exit 1
        fi
        sudo=(sudo)
    fi
    echo "install-chromium: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    echo "install-chromium: installed ${missing[*]}"
else
    echo "install-chromium: nothing to install"
fi

if ! command -v chromium >/dev/null 2>&1; then
    echo "install-chromium: chromium is still not on PATH after installing" >&2
    exit 1
fi
echo "install-chromium: $(chromium --version 2>/dev/null | head -n 1)"
