//go:build tools

// Package tools pins github.com/coredns/coredns.
package tools

import _ "github.com/coredns/coredns"
