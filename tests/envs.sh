# Helpers for tests/run.sh and the side environments' scripts (tests/*_env.sh). Sourced, never run.
#
#   installer_setup                 picks the installer: uv (from PyPI, into .venv-tools) when it can be had, else pip
#   env_install VENV ARGS...        `pip install ARGS` into VENV, through that installer
#   setup_env VENV CONSTRAINTS SPECS...   creates VENV if missing, installs torch==2.13.0 first, then SPECS under CONSTRAINTS
#   side_pytest NAME ARGS...        pytest in .venv-NAME on the test files that hold tests marked NAME
#
# uv installs the same packages as pip, several times faster: it downloads in parallel and keeps one unpacked copy of
# each wheel in its cache, which every environment then links to (torch, transformers and the rest are shared by five
# environments). EVALSTOP_INSTALLER=pip skips it. uv reads no pip configuration, so the package sources pip is set up
# with (find-links, index URLs, constraint files and the CA bundle, from pip.conf files and PIP_* variables alike;
# `pip config list` shows them) are handed to it explicitly. pip considers every index's releases of a package; uv by
# default only the first index that has one, hence --index-strategy unsafe-best-match (a local mirror listed as an
# extra index may hold older releases than PyPI).
# Every function returns non-zero at its first failed step (they run in the background, where `set -e` does not reach).

uv_bin="" uv_sources=() uv_cert=""  # installer_setup sets them

_pip_sources_for_uv() {  # one uv option or value a line, from pip's configuration
    "$PY" - <<'EOF'
import ast
import subprocess
import sys

listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
options = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "constraint": "--constraint"}
seen: set[tuple[str, str]] = set()
for line in listing.splitlines():  # `section.key='value'`; section is global, install, :env:, ...
    key, _, value = line.partition("=")
    option = options.get(key.rsplit(".", 1)[-1])
    if option is None or not value:
        continue
    for item in ast.literal_eval(value).split():
        if (option, item) in seen or (option == "--index-url" and any(o == option for o, _ in seen)):
            continue  # the same source from a file and a variable; one index URL only (pip's: the first)
        seen.add((option, item))
        print(option, item, sep="\n")
EOF
}

_pip_cert() {  # the CA bundle pip is configured with, if any
    "$PY" -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | head -n 1
}

installer_setup() {
    if [ "${EVALSTOP_INSTALLER:-uv}" != pip ]; then
        if command -v uv >/dev/null 2>&1; then
            uv_bin=$(command -v uv)
        else
            { [ -x .venv-tools/bin/uv ] || { "$PY" -m venv .venv-tools && .venv-tools/bin/pip install -q uv; }; } \
                && uv_bin=$PWD/.venv-tools/bin/uv \
                || echo "tests/envs.sh: could not install uv; installing with pip" >&2
        fi
    fi
    if [ -n "$uv_bin" ]; then
        mapfile -t uv_sources < <(_pip_sources_for_uv)
        uv_cert=$(_pip_cert)
    fi
    return 0
}

env_install() {
    local venv=$1
    shift
    if [ -n "$uv_bin" ]; then
        local cert=()
        [ -n "${SSL_CERT_FILE:-}" ] || [ -z "$uv_cert" ] || cert=("SSL_CERT_FILE=$uv_cert")
        env "${cert[@]}" "$uv_bin" pip install -q --python "$venv/bin/python" --index-strategy unsafe-best-match \
            "${uv_sources[@]}" "$@"
    else
        "$venv/bin/python" -m pip install -q "$@"
    fi
}

setup_env() {
    local venv=$1 constraints=$2
    shift 2
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv" || return
    # torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
    env_install "$venv" torch==2.13.0 || return
    env_install "$venv" -c "$constraints" "$@"
}

side_pytest() {
    # Only the files that hold NAME's tests are collected: the others import packages that environment lacks. Exit
    # code 5 means none were selected (e.g. by -k) and is no failure.
    local name=$1 files rc=0
    shift
    mapfile -t files < <(grep -l "mark\.$name\b" tests/test_*.py)
    [ "${#files[@]}" -gt 0 ] || return 0
    ".venv-$name/bin/python" -m pytest "${files[@]}" "$@" || rc=$?
    [ "$rc" -eq 5 ] && rc=0
    return "$rc"
}
