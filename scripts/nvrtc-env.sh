# shellcheck shell=bash
# NVRTC (the CUDA runtime compiler) for the tests that compile kernels/*.cu without a GPU.
#
#   source scripts/nvrtc-env.sh      # installs it if needed, exports LD_LIBRARY_PATH
#   eval "$(scripts/nvrtc-env.sh)"   # the same, from a shell that does not source it
#
# Installs the `nvidia-cuda-nvrtc` wheel from PyPI with pip into a per-user cache
# (${ENGINE_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/engine-nvrtc/<version>}); a second
# run finds it there and does not touch the network. The wheel holds libnvrtc.so.13 (which
# cudarc opens by that name, through the loader's search path) and libnvrtc-builtins.so.13.0
# (which libnvrtc opens by name too), so the folder holding both goes on LD_LIBRARY_PATH.
# Needs python3 with pip on the first run only.

_engine_nvrtc_setup() {
    local version="${ENGINE_NVRTC_VERSION:-13.0.88}"
    local dir="${ENGINE_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/engine-nvrtc/$version}"
    local lib="$dir/nvidia/cu13/lib"
    if [ ! -e "$lib/libnvrtc.so.13" ] || ! compgen -G "$lib/libnvrtc-builtins.so*" >/dev/null; then
        local python
        python="$(command -v python3 || command -v python || true)"
        if [ -z "$python" ] || ! "$python" -m pip --version >/dev/null 2>&1; then
            echo "nvrtc-env.sh: python3 with pip is needed to install nvidia-cuda-nvrtc==$version" >&2
            return 1
        fi
        echo "nvrtc-env.sh: installing nvidia-cuda-nvrtc==$version into $dir" >&2
        # Into a temporary folder first, so an interrupted install is never taken as done.
        local tmp="$dir.tmp.$$"
        rm -rf "$tmp"
        mkdir -p "$(dirname "$dir")"
        if ! PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-deps \
            --no-compile --target "$tmp" "nvidia-cuda-nvrtc==$version" >&2; then
            rm -rf "$tmp"
            echo "nvrtc-env.sh: pip install nvidia-cuda-nvrtc==$version failed" >&2
            return 1
        fi
        rm -rf "$dir"
        mv "$tmp" "$dir"
    fi
    if [ ! -e "$lib/libnvrtc.so.13" ]; then
        echo "nvrtc-env.sh: $lib/libnvrtc.so.13 is missing after the install" >&2
        return 1
    fi
    case ":${LD_LIBRARY_PATH:-}:" in
    *":$lib:"*) ;;
    *) export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    esac
    export ENGINE_NVRTC_LIB="$lib"
}

if (return 0 2>/dev/null); then
    # Sourced: set up this shell.
    _engine_nvrtc_setup
else
    # Run: print the lines to eval.
    set -euo pipefail
    _engine_nvrtc_setup
    printf 'export LD_LIBRARY_PATH=%q\nexport ENGINE_NVRTC_LIB=%q\n' "$LD_LIBRARY_PATH" "$ENGINE_NVRTC_LIB"
fi
