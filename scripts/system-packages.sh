#!/usr/bin/env bash
# Debian packages Chorus uses outside Python: espeak-ng (test fixtures, corpus voices), flite and
# festival (corpus voices), sox (virtual speakers), postgresql (the shared-store tests start a throwaway
# cluster of their own; Debian's own cluster is not used). Installs what is missing when run as root;
# otherwise prints the command to run.
set -euo pipefail
packages=(espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k sox libsndfile1 postgresql)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
