#!/usr/bin/env bash
# Installs one pinned PyPI package (with its dependencies) into a per-user cache folder on
# the first call, and prints that folder for PYTHONPATH. Needs python3 + pip.
# Usage: pip-target.sh NAME VERSION
set -euo pipefail
name=$1 version=$2
dir="${XDG_CACHE_HOME:-$HOME/.cache}/$name/$version"
if [ ! -e "$dir/.installed" ]; then
    echo "pip-target.sh: installing $name==$version into $dir" >&2
    rm -rf "$dir.tmp.$$"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
        --target "$dir.tmp.$$" "$name==$version" >&2
    rm -rf "$dir" && mv "$dir.tmp.$$" "$dir" && touch "$dir/.installed"
fi
echo "$dir"
