#!/usr/bin/env bash
# Builds the pinned tools into bin/ from the Go module proxy.
#
# Each tool has a module of its own under hack/tools/<tool>/ whose go.mod is
# the pin. A tool is built only when its pin changes: binaries are kept in a
# per-user cache keyed by the hash of the pin (go.mod + go.sum, and the Go
# files and C headers of the tool module's own) and the build recipe, so a
# fresh clone on the same machine reuses them, and bin/ gets a copy.
# Binaries a user already has are used instead where the test harness
# supports it (KUBEBUILDER_ASSETS for etcd and kube-apiserver).
#
# usage: hack/tools/install.sh [tool...]   (default: every tool)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${BIN_DIR:-$root/bin}
cache=${MO_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/model-orchestra/tools}
# Bump when a build recipe below changes, so that every tool is rebuilt.
recipe=1
mkdir -p "$bin" "$cache"

k8s_version=v1.36.3
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=36"

all=(etcd kubernetes kwok helm controller-gen golangci-lint coredns helm-operator-plugins ollama olm opm)

# build <tool> <out-dir>: runs in the tool's module directory.
build() {
	local out=$2
	case $1 in
	kubernetes)
		go build -trimpath -ldflags "$k8s_ldflags" -o "$out/" \
			k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
			k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
			k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl ;;
	etcd) go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3 ;;
	kwok) go build -trimpath -ldflags "-s -w" -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok ;;
	coredns) CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/coredns" github.com/coredns/coredns ;;
	controller-gen) go build -trimpath -o "$out/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen ;;
	golangci-lint)
		v=$(go list -m -f '{{.Version}}' github.com/golangci/golangci-lint/v2)
		go build -trimpath -ldflags "-s -w -X main.version=${v#v}" -o "$out/golangci-lint" github.com/golangci/golangci-lint/v2/cmd/golangci-lint ;;
	helm)
		v=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)
		go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$v" -o "$out/helm" helm.sh/helm/v3/cmd/helm ;;
	helm-operator-plugins)
		# The peer of make bench-reconcile: the module's own helm-operator
		# command, and tuned/ (the same with a client rate-limit flag).
		v=$(go list -m -f '{{.Version}}' github.com/operator-framework/helm-operator-plugins)
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/operator-framework/helm-operator-plugins/internal/version.GitVersion=$v" \
			-o "$out/helm-operator" github.com/operator-framework/helm-operator-plugins
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/helm-operator-tuned" ./tuned ;;
	olm)
		# OLM v0's two controllers, run as plain processes by the real-OLM
		# tier (internal/olm/realolm).
		v=$(go list -m -f '{{.Version}}' github.com/operator-framework/operator-lifecycle-manager)
		go build -trimpath -ldflags "-s -w -X github.com/operator-framework/operator-lifecycle-manager/pkg/version.OLMVersion=${v#v}" -o "$out/" \
			github.com/operator-framework/operator-lifecycle-manager/cmd/olm \
			github.com/operator-framework/operator-lifecycle-manager/cmd/catalog
		# OLM's CRDs, which the tier applies before starting OLM.
		d=$(go list -m -f '{{.Dir}}' github.com/operator-framework/operator-lifecycle-manager)
		for f in "$d"/deploy/chart/crds/*.yaml; do echo "---"; cat "$f"; done > "$out/olm-crds.yaml" ;;
	opm)
		# The tags of operator-registry's own Makefile: sqlite's JSON
		# functions, and OpenPGP in Go instead of gpgme (cgo).
		v=$(go list -m -f '{{.Version}}' github.com/operator-framework/operator-registry)
		go build -trimpath -tags=json1,containers_image_openpgp -ldflags "-s -w -X github.com/operator-framework/operator-registry/cmd/opm/version.gitCommit=$v -X github.com/operator-framework/operator-registry/cmd/opm/version.opmVersion=$v" \
			-o "$out/opm" github.com/operator-framework/operator-registry/cmd/opm ;;
	ollama)
		# The real engine of the tests and the demo: CPU-only (the cgo
		# package under ml/backend/ggml compiles the CPU backend in), static
		# and stripped. The module zip lacks llama.cpp's vendor/: nlohmann
		# and stb come from Debian (hack/setup-node.sh installs them),
		# miniaudio is our stub in include/ (audio input of multimodal
		# models fails; nothing else changes).
		local h
		for h in /usr/include/nlohmann/json.hpp /usr/include/stb/stb_image.h; do
			[ -f "$h" ] || {
				echo "install.sh: building ollama needs $h: install Debian's nlohmann-json3-dev and libstb-dev (sudo hack/setup-node.sh does), or build without the Ollama image: make images OLLAMA_IMAGE=0" >&2
				return 2
			}
		done
		v=$(go list -m -f '{{.Version}}' github.com/ollama/ollama)
		CGO_ENABLED=1 CGO_CPPFLAGS="-I$PWD/include" go build -trimpath -tags netgo,osusergo \
			-ldflags "-s -w -linkmode external -extldflags -static -X github.com/ollama/ollama/version.Version=${v#v}" \
			-o "$out/ollama" github.com/ollama/ollama ;;
	*) echo "install.sh: unknown tool $1 (known: ${all[*]})" >&2; return 2 ;;
	esac
}

# elapsed <start>: the time since start (seconds since the epoch), as 4m05s.
elapsed() {
	local d=$(( $(date +%s) - $1 ))
	printf '%dm%02ds' $((d / 60)) $((d % 60))
}

# ticker_for <tool> <start>: says every 30 s that the build still runs (the
# first build of Kubernetes takes minutes). Its sleep holds no output open,
# so a pipe after make ends when the build does.
ticker_for() {
	local s=
	trap 'kill $s 2>/dev/null; exit 0' TERM
	while :; do
		sleep 30 >/dev/null 2>&1 </dev/null &
		s=$!
		wait "$s"
		echo ">> still building $1: $(elapsed "$2")"
	done
}

# A failed or interrupted build stops the ticker too.
ticker=
trap '[ -z "$ticker" ] || kill "$ticker" 2>/dev/null || true' EXIT

for tool in "${@:-${all[@]}}"; do
	dir=$root/hack/tools/$tool
	[ -f "$dir/go.mod" ] || { echo "install.sh: no pin for $tool in $dir" >&2; exit 2; }
	key=$( { cat "$dir/go.mod" "$dir/go.sum" $(find "$dir" -mindepth 2 \( -name '*.go' -o -name '*.h' \) | sort); echo "recipe=$recipe"; } | sha256sum | cut -c1-16)
	stamp=$bin/.stamps/$tool-$key
	[ -e "$stamp" ] && continue
	built=$cache/$tool-$key
	if [ ! -e "$built/.complete" ]; then
		echo ">> building $tool (pin $key; once per pin, then reused from $cache)"
		start=$(date +%s)
		rm -rf "$built" && mkdir -p "$built"
		ticker_for "$tool" "$start" &
		ticker=$!
		(cd "$dir" && build "$tool" "$built")
		kill "$ticker" 2>/dev/null || true
		wait "$ticker" 2>/dev/null || true
		ticker=
		touch "$built/.complete"
		echo ">> built $tool in $(elapsed "$start")"
	fi
	cp -f "$built"/* "$bin/"
	mkdir -p "$bin/.stamps"
	rm -f "$bin/.stamps/$tool"-*
	touch "$stamp"
done
