#!/usr/bin/env bash
# Installs the Debian packages the cluster and browser tests need when they are missing. Without root
# it installs nothing and those tests are skipped with the reason.
set -euo pipefail
packages=(openssh-server openssh-client pdsh iproute2 iptables procps chromium slurm-wlm slurm-client munge prometheus)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "system-deps: not root; missing ${missing[*]}: the cluster tests will be skipped" >&2
    exit 0
fi
echo "system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
