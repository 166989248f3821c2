//go:build tools

// Package tools pins github.com/operator-framework/helm-operator-plugins, the
// peer that make bench-reconcile measures our Helm reconciler against: its
// own helm-operator command (the module's main package, "helm-operator run")
// is built as bin/helm-operator, and tuned/ is the same command with the
// client rate limit as a flag, built as bin/helm-operator-tuned.
package tools

import _ "github.com/operator-framework/helm-operator-plugins"
