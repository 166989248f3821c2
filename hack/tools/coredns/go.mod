module github.com/model-orchestra/operator/hack/tools/coredns

go 1.26.0

require github.com/coredns/coredns v1.14.7
