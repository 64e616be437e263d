# Shared by scripts/test and scripts/bench: make this machine able to run them, idempotently.
# Each step checks first and installs only what is missing, so a second run installs nothing.
# Sourced, not run: the caller has `set -euo pipefail` and is in the repository's root.

say() { printf 'setup: %s\n' "$*" >&2; }

# Debian packages for the commands named (command:package pairs). Root installs directly; otherwise
# `sudo -n`; with neither, stop with exit 3 and the exact command to run.
ensure_debian_packages() {
    local pair missing=()
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local run=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            run=(sudo -n)
        else
            say "missing Debian packages: ${missing[*]}"
            say "not root and no password-less sudo; install them, then run this again:"
            say "  sudo apt-get update && sudo apt-get install -y ${missing[*]}"
            exit 3
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        say "missing packages ${missing[*]} and no apt-get here: install them with your package manager"
        exit 3
    fi
    say "installing Debian packages: ${missing[*]}"
    "${run[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

# This checkout installed (editable) with the given extras, and every requirement satisfied.
ensure_python_package() {
    local extras="$1"
    if python3 scripts/installed.py "$extras"; then
        return 0
    fi
    say "installing settle-proxy[$extras] (editable) with pip"
    python3 -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
}

# The npm packages package-lock.json pins (the real opencode server, the official SDK).
ensure_npm_packages() {
    if [ -d node_modules ] && npm ls --all >/dev/null 2>&1; then
        return 0
    fi
    say "installing the pinned npm packages"
    npm install --no-audit --no-fund --loglevel=error
}
