//go:build tools

// Package tools pins go.etcd.io/etcd/server/v3.
package tools

import _ "go.etcd.io/etcd/server/v3"
