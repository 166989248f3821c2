#!/usr/bin/env bash
# Puts a criu that passes `criu check` on this kernel into bin/, for the
# process snapshot tests and bench-tiers. `make test` calls it (as root).
#
# Debian 12's criu (3.17) fails `criu check` on Linux 6.13 and later: it
# cannot parse the split vDSO data area ([vvar] + [vvar_vclock]). criu 4.1
# passes the check but cannot dump a TCP socket on Linux 6.16 and later (it
# asks for SO_PASSSEC, which those kernels refuse on TCP). criu 4.2 does
# both. When the criu on PATH is at least that and passes, this does
# nothing. Otherwise it builds the pinned criu release from Debian's source
# archive (the tarball's SHA-256 is checked), after installing its Debian
# build dependencies, and keeps the binary in the per-user tools cache, so
# later runs and fresh clones on the same machine copy it in seconds.
#
# usage: hack/setup-criu.sh            build it (root on Debian)
#        hack/setup-criu.sh --if-root  only where the tests that use it run:
#                                      root on Linux (make test)
#
# Environment:
#   MO_DEBIAN_MIRROR  where Debian's pool is (default http://deb.debian.org/debian)
#   MO_TOOLS_CACHE    the tools cache (as hack/tools/install.sh)
#   MO_NODE_INSTALL   "never": do not run apt-get; print the command instead
#                     (as hack/setup-node.sh)
set -euo pipefail

version=4.2.1
sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
build_deps=(build-essential pkgconf libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev
	libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev python3 python3-protobuf)

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN_DIR:-$root/bin}
cache=${MO_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/model-orchestra/tools}/criu-$version
mirror=${MO_DEBIAN_MIRROR:-http://deb.debian.org/debian}

if_root=false
case ${1:-} in
--if-root) if_root=true ;;
"") ;;
*) echo "usage: hack/setup-criu.sh [--if-root]" >&2; exit 2 ;;
esac

if [ "$(uname -s)" != Linux ] || [ "$(id -u)" != 0 ]; then
	$if_root && exit 0 # the snapshot tests say why they skip
	echo "setup-criu: criu runs as root on Linux: run it as root (sudo hack/setup-criu.sh)." >&2
	exit 1
fi

min_version=4.2

# passes <criu>: it is at least min_version and `criu check` passes.
passes() {
	local v
	v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *//p')
	[ -n "$v" ] && [ "$(printf '%s\n%s\n' "$min_version" "$v" | sort -V | head -1)" = "$min_version" ] &&
		"$1" check >/dev/null 2>&1
}

mkdir -p "$bin"
if [ -x "$cache/criu" ] && passes "$cache/criu"; then
	cp "$cache/criu" "$bin/criu"
	exit 0
fi
if command -v criu >/dev/null && passes "$(command -v criu)"; then
	exit 0
fi

if ! command -v apt-get >/dev/null; then
	echo "setup-criu: no criu here passes \`criu check\`; install criu $version or later with the system's package manager." >&2
	exit 1
fi

start=$(date +%s)
missing=()
for p in "${build_deps[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] && [ "${MO_NODE_INSTALL:-auto}" = never ]; then
	{
		echo "setup-criu: no criu here passes \`criu check\`, and building criu $version needs Debian packages this machine lacks: ${missing[*]}."
		echo "Install them, then run it again:"
		echo "    apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
	} >&2
	exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
	echo ">> installing criu's build dependencies: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
		echo "setup-criu: installing ${missing[*]} failed (apt-get's message is above)." >&2
		exit 1
	fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tarball=criu_$version.orig.tar.xz
echo ">> building criu $version from $mirror/pool/main/c/criu/$tarball"
if ! curl -fsSL --retry 3 -o "$work/$tarball" "$mirror/pool/main/c/criu/$tarball"; then
	echo "setup-criu: downloading $mirror/pool/main/c/criu/$tarball failed." >&2
	exit 1
fi
if ! echo "$sha256  $work/$tarball" | sha256sum -c --quiet -; then
	echo "setup-criu: $tarball does not have the pinned SHA-256 $sha256." >&2
	exit 1
fi
tar -xJf "$work/$tarball" -C "$work"
if ! make -C "$work/criu-$version" -j"$(nproc)" criu >"$work/build.log" 2>&1; then
	tail -20 "$work/build.log" >&2
	echo "setup-criu: building criu $version failed (the end of its log is above)." >&2
	exit 1
fi
mkdir -p "$cache"
cp "$work/criu-$version/criu/criu" "$cache/criu"
cp "$cache/criu" "$bin/criu"
if ! out=$("$bin/criu" check 2>&1); then
	echo "setup-criu: criu $version was built, but \`criu check\` fails on this machine too: $out" >&2
	echo "The process snapshot tests will say so and skip their round trip." >&2
	exit 0
fi
echo ">> criu $version in $bin/criu: $(( $(date +%s) - start ))s"
