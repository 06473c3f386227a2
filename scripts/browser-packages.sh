#!/usr/bin/env bash
# Optional Debian packages for the web page test (tests/serving/test_serving_web.py): chromium, driven headless
# by Playwright from the dev extra (never `playwright install`, which downloads browsers). Installs what
# is missing when run as root; otherwise, or when apt fails, says so and exits 0: the test then skips (a
# skip that scripts/test.sh turns into a failure: CI must run it).
set -uo pipefail
packages=(chromium)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; then
  exit 0
fi
echo "optional Debian packages missing: ${missing[*]} (the web page test will be skipped, and fail under scripts/test.sh)" >&2
echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
exit 0
