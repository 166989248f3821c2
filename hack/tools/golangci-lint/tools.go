//go:build tools

// Package tools pins github.com/golangci/golangci-lint/v2/cmd/golangci-lint.
package tools

import _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
