// Package localcluster runs a local Kubernetes cluster from the pinned
// binaries in bin/ (etcd, kube-apiserver and, as asked, the controller
// manager and scheduler), with no Docker and no kind. Its nodes are either
// simulated by kwok or one real node on this machine (containerd, kubelet,
// kube-proxy, CoreDNS; Linux and root only), whose changes to the host are
// undone by Stop, or by CleanupStale after a crash. Tests start one with
// StartForTest, which skips under -short and stops it in t.Cleanup; people
// start one with cmd/devcluster (`make run`); docs/localcluster.md has the
// details.
package localcluster
