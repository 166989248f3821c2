module github.com/model-orchestra/operator/hack/tools/controller-gen

go 1.26.0

require sigs.k8s.io/controller-tools v0.21.0
