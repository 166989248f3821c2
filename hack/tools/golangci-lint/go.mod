module github.com/model-orchestra/operator/hack/tools/golangci-lint

go 1.26.0

require github.com/golangci/golangci-lint/v2 v2.15.0
