#!/usr/bin/env bash
# Makes this machine able to run the local cluster's real node (containerd,
# runc, the CNI plugins, iptables, conntrack, socat) and to build the pinned
# Ollama (g++ and the C++ headers its module zip lacks: nlohmann-json3-dev,
# libstb-dev; hack/tools/install.sh ollama) and to pack its image (busybox-static,
# the image's /bin/sh), before anything is built. `make run`, `make test` and .ci/run call it; it does nothing when
# everything is there.
#
# As root on Debian it installs the missing packages with apt-get. Otherwise
# it stops at once and prints the exact command to run.
#
# usage: hack/setup-node.sh            the real node must run here (make run, CI)
#        hack/setup-node.sh --if-root  only when the real-node tests run here,
#                                      that is as root on Linux (make test)
#
# Environment:
#   MO_NODE_PACKAGES  the Debian packages to check (default below)
#   MO_NODE_INSTALL   "never": only check and print the command, as a user
#                     who keeps apt-get out of make would want
#   MO_SETUP_FOR      what the user ran (make run, make test), for the messages
set -euo pipefail

# shellcheck disable=SC2206 # a space-separated list, split on purpose
packages=(${MO_NODE_PACKAGES:-containerd runc containernetworking-plugins iptables conntrack socat g++ nlohmann-json3-dev libstb-dev busybox-static})
install=${MO_NODE_INSTALL:-auto}
case $install in auto | never) ;; *) echo "setup-node: MO_NODE_INSTALL=$install: want auto or never" >&2; exit 2 ;; esac
if_root=false
case ${1:-} in
--if-root) if_root=true ;;
"") ;;
*) echo "usage: hack/setup-node.sh [--if-root]" >&2; exit 2 ;;
esac

target=${MO_SETUP_FOR:-hack/setup-node.sh}

if [ "$(uname -s)" != Linux ]; then
	$if_root && exit 0 # the real-node tests skip off Linux
	echo "setup-node: $target needs Linux: the local cluster's real node runs containerd and kubelet on this machine." >&2
	exit 1
fi

debian=false
if command -v dpkg-query >/dev/null && command -v apt-get >/dev/null; then
	debian=true
fi

# missing lists the packages (on Debian) or the commands (elsewhere) that
# are not installed.
missing=()
if $debian; then
	for p in "${packages[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
else
	for c in containerd runc iptables conntrack socat; do
		command -v "$c" >/dev/null || missing+=("$c")
	done
	[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || missing+=("CNI plugins (bridge in /usr/lib/cni or /opt/cni/bin)")
	command -v g++ >/dev/null || missing+=(g++)
	[ -f /usr/include/nlohmann/json.hpp ] || missing+=("nlohmann/json headers (/usr/include/nlohmann/json.hpp)")
	[ -f /usr/include/stb/stb_image.h ] || missing+=("stb headers (/usr/include/stb/stb_image.h)")
	[ -x /bin/busybox ] || missing+=("busybox (/bin/busybox, the ollama image's shell)")
fi

apt_command="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"

if [ "$(id -u)" != 0 ]; then
	if $if_root; then
		echo "setup-node: not root, so the real-node and end-to-end tests will skip (sudo $target runs them)."
		exit 0
	fi
	{
		echo "setup-node: $target needs root: the local cluster's real node runs containerd, kubelet and iptables."
		if [ ${#missing[@]} -gt 0 ] && $debian; then
			echo "Run it as root; it then also installs the missing packages (${missing[*]}):"
		else
			echo "Run it as root:"
		fi
		echo "    sudo $target"
	} >&2
	exit 1
fi

[ ${#missing[@]} -eq 0 ] && exit 0

if ! $debian; then
	{
		echo "setup-node: the real node needs, and this machine lacks: ${missing[*]}."
		echo "Install them with the system's package manager (on Debian: apt-get install containerd runc containernetworking-plugins iptables conntrack socat g++ nlohmann-json3-dev libstb-dev busybox-static), then run $target again."
	} >&2
	exit 1
fi

if [ "$install" = never ]; then
	{
		echo "setup-node: the real node needs Debian packages this machine lacks: ${missing[*]}."
		echo "Install them, then run $target again:"
		echo "    $apt_command"
	} >&2
	exit 1
fi

echo ">> installing the real node's packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
	{
		echo "setup-node: installing ${missing[*]} failed (apt-get's message is above)."
		echo "Install them, then run $target again:"
		echo "    $apt_command"
	} >&2
	exit 1
fi
echo ">> installed ${missing[*]}"
