#!/usr/bin/env bash
# Builds the pinned tools into bin/ from the Go module proxy.
#
# Each tool has a module of its own under hack/tools/<tool>/ whose go.mod is
# the pin. A tool is rebuilt only when its pin changes: the build writes a
# stamp named after the hash of that go.mod and go.sum.
#
# usage: hack/tools/install.sh [tool...]   (default: every tool)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${BIN_DIR:-$root/bin}
stamps=$bin/.stamps
mkdir -p "$bin" "$stamps"

k8s_version=v1.36.3
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=36"

all=(etcd kubernetes kwok helm controller-gen golangci-lint coredns)

# build <tool>: runs in the tool's module directory.
build() {
	case $1 in
	kubernetes)
		go build -trimpath -ldflags "$k8s_ldflags" -o "$bin/" \
			k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
			k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
			k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl ;;
	etcd) go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3 ;;
	kwok) go build -trimpath -ldflags "-s -w" -o "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok ;;
	coredns) CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/coredns" github.com/coredns/coredns ;;
	controller-gen) go build -trimpath -o "$bin/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen ;;
	golangci-lint)
		v=$(go list -m -f '{{.Version}}' github.com/golangci/golangci-lint/v2)
		go build -trimpath -ldflags "-s -w -X main.version=${v#v}" -o "$bin/golangci-lint" github.com/golangci/golangci-lint/v2/cmd/golangci-lint ;;
	helm)
		v=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)
		go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$v" -o "$bin/helm" helm.sh/helm/v3/cmd/helm ;;
	*) echo "install.sh: unknown tool $1 (known: ${all[*]})" >&2; return 2 ;;
	esac
}

for tool in "${@:-${all[@]}}"; do
	dir=$root/hack/tools/$tool
	[ -f "$dir/go.mod" ] || { echo "install.sh: no pin for $tool in $dir" >&2; exit 2; }
	key=$(cat "$dir/go.mod" "$dir/go.sum" "$0" | sha256sum | cut -c1-16)
	stamp=$stamps/$tool-$key
	if [ -e "$stamp" ]; then
		continue
	fi
	echo ">> building $tool (pin $key)"
	start=$(date +%s)
	(cd "$dir" && build "$tool")
	rm -f "$stamps/$tool"-*
	touch "$stamp"
	echo ">> built $tool in $(( $(date +%s) - start ))s"
done
