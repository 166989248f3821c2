//go:build tools

// Package tools pins operator-registry's opm, which serves the catalogs over
// gRPC in the real-OLM test tier and validates them (make validate-catalog
// runs opm validate's code; the tier runs the binary too).
package tools

import _ "github.com/operator-framework/operator-registry/cmd/opm"
