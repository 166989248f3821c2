// Package agent is the orchestra-agent binary's shared part: its
// configuration (Config: the role, the listen address, and each role's
// own configuration), Run, which serves the chosen role, and Start, which
// builds it (tests start an agent in process with it). The roles are
// packages of their own:
//
//   - internal/sidecar (--role sidecar): the per-engine sidecar, which drives
//     its engine's own sleep and wake API; its wire types and client are
//     internal/sidecarapi;
//   - internal/nodeagent (--role node): the node agent, which owns the
//     node's hot and warm tiers; its wire types, the authentication of its
//     callers and its client are internal/nodeapi.
//
// cmd/orchestra-agent parses the flags into a Config and calls Run.
// docs/checkpoint.md is the reference of both roles.
//
// Files:
//   - config.go: Config, the roles, Default, Validate.
//   - run.go: Run, Start.
package agent
