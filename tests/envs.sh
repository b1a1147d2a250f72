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
# `pip config list` shows them) are handed to it explicitly. pip weighs every file of every index alike and takes the
# best match for this Python; uv takes a release's files from the first index that has the release (also with
# --index-strategy unsafe-best-match, which at least lets it see newer releases on later indexes). A mirror's partial
# copy of a release can then win: this machine's first mirror holds only multiprocess 0.70.19's py310 wheel, which
# fails on Python 3.11 (fork_exec), where pip takes PyPI's py311 one. So the main index (pip's index-url, else PyPI)
# goes first, the configured extra indexes after it: a release on the main index is taken with all of its files.
# Every function returns non-zero at its first failed step (they run in the background, where `set -e` does not reach).

uv_bin="" uv_sources=() uv_cert=""  # installer_setup sets them

_pip_sources_for_uv() {  # one uv option or value a line, from pip's configuration
    "$PY" - <<'EOF'
import ast
import subprocess
import sys

listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
found: dict[str, list[str]] = {"find-links": [], "index-url": [], "extra-index-url": [], "constraint": []}
for line in listing.splitlines():  # `section.key='value'`; section is global, install, :env:, ...
    key, _, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    if name in found and value:
        found[name] += [item for item in ast.literal_eval(value).split() if item not in found[name]]
main = (found["index-url"] or ["https://pypi.org/simple"])[0]  # pip's: the first one set
options = [("--index-url", main)] + [("--extra-index-url", url) for url in [main, *found["extra-index-url"]]]
options += [("--find-links", item) for item in found["find-links"]]
options += [("--constraint", item) for item in found["constraint"]]
for option, item in options:
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
