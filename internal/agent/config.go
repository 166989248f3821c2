package agent

import (
	"errors"
	"fmt"

	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/sidecar"
)

// Roles of orchestra-agent.
const (
	// RoleSidecar is the sidecar in each engine pod.
	RoleSidecar = "sidecar"
	// RoleNode is the DaemonSet that owns the node's hot and warm tiers.
	RoleNode = "node"
	// RoleSeatDeprecated is the sidecar's role name in earlier releases ("seat"
	// now means only an accelerator seat of a seat group): still accepted
	// for one release, with a warning, by CanonicalRole. Remove after it.
	RoleSeatDeprecated = "seat"
)

// CanonicalRole returns the role named by role, and whether role is a
// deprecated name of it (RoleSeatDeprecated for RoleSidecar), for the
// caller to warn about.
func CanonicalRole(role string) (canonical string, deprecated bool) {
	if role == RoleSeatDeprecated {
		return RoleSidecar, true
	}
	return role, false
}

// Config configures orchestra-agent. Default holds every default;
// Validate reports every invalid field at once.
type Config struct {
	// Role is sidecar or node.
	Role string `json:"role"`
	// Addr is the HTTP listen address of the agent's API, /readyz and
	// /metrics.
	Addr    string               `json:"addr"`
	Sidecar sidecar.Config       `json:"sidecar"`
	Node    nodeagent.NodeConfig `json:"node"`
}

// Default returns the defaults of both roles.
func Default() Config {
	return Config{Role: RoleSidecar, Addr: ":8090", Sidecar: sidecar.DefaultConfig(), Node: nodeagent.DefaultNodeConfig()}
}

// Validate reports every invalid field of the agent and of its role.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("addr must not be empty"))
	}
	switch c.Role {
	case RoleSidecar:
		errs = append(errs, c.Sidecar.Validate())
	case RoleNode:
		errs = append(errs, c.Node.Validate())
	default:
		errs = append(errs, fmt.Errorf("role must be %s or %s, got %q", RoleSidecar, RoleNode, c.Role))
	}
	return errors.Join(errs...)
}
