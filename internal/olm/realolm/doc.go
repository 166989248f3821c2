// Package realolm is the real-OLM test tier: OLM v0's own olm and catalog
// controllers (operator-lifecycle-manager v0.38.0) and opm (operator-registry
// v1.73.0), built by hack/tools/install.sh olm opm, run against the local
// control plane (internal/localcluster, kwok nodes: OLM needs the operator's
// Deployment Available, not the operator running). opm serves the committed
// image-less catalog (catalog/inline) over gRPC to a CatalogSource with
// spec.address, and the test installs the operator with real Subscriptions,
// applying the manifests of docs/examples/olm as the docs show them.
//
// The package has only tests: go test ./internal/olm/realolm.
package realolm
