//go:build tools

// Package tools pins OLM v0's olm and catalog commands
// (github.com/operator-framework/operator-lifecycle-manager), which the
// real-OLM test tier (internal/olm/realolm) runs against the local control
// plane.
package tools

import (
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/catalog"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/olm"
)
