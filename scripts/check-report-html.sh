#!/usr/bin/env bash
# Opens rendered reports in headless Chromium (Debian's `chromium` package), fails on console
# messages from the page, and saves a full-page screenshot of each to look at.
#
#   scripts/check-report-html.sh                 # renders the demo sweep / compare / run reports
#   scripts/check-report-html.sh path/report.html ...
#
# Screenshots go to $OUT_DIR (default /tmp/report-screenshots). Needs: apt-get install -y chromium
set -euo pipefail

cd "$(dirname "$0")/.."
out_dir="${OUT_DIR:-/tmp/report-screenshots}"
mkdir -p "$out_dir"

if ! command -v chromium >/dev/null; then
    echo "chromium not found: install it with 'apt-get install -y chromium'" >&2
    exit 1
fi

if [ "$#" -eq 0 ]; then
    demo="$out_dir/demo"
    rm -rf "$demo"
    REPORTS_DEMO_OUT="$demo" cargo test --release -q -p reports --test render >/dev/null
    set -- "$demo"/*/report.html
fi

status=0
for html in "$@"; do
    html="$(realpath "$html")"
    name="$(basename "$(dirname "$html")")"
    shot="$out_dir/$name.png"
    log="$out_dir/$name.log"
    chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
        --disable-component-update --disable-sync --no-first-run --enable-logging=stderr --v=0 \
        --screenshot="$shot" --window-size=1200,3000 "file://$html" 2>"$log" >/dev/null || true
    if [ ! -s "$shot" ]; then
        echo "FAIL $html: no screenshot (see $log)"
        status=1
    elif grep -q "CONSOLE" "$log"; then
        echo "FAIL $html: console messages:"
        grep "CONSOLE" "$log"
        status=1
    else
        echo "ok   $html -> $shot"
    fi
done
exit "$status"
