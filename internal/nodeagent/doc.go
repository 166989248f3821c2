// Package nodeagent is orchestra-agent's node agent (--role node): one
// runs on each node of the release. It owns the node's hot (tmpfs) and
// warm (disk) tiers within byte budgets, copies the weights between them
// and the cold tier (the model cache or S3) and verifies every copy,
// predicts wakes from the records the lifecycle leader sends and promotes
// ahead of them, reports what the node can do (GET /report), and takes
// process snapshots where criu works. Its wire types, the authentication
// of its callers and its client are internal/nodeapi.
//
// Files:
//   - node.go: Node and its HTTP API.
//   - node_config.go: NodeConfig, its defaults and validation.
//   - node_start.go: StartNode, the role's start.
//   - node_metrics.go: the node agent's metrics.
//   - node_snapshot.go: the process snapshot endpoint.
//   - store.go: Store, the tiers on disk; store_demote.go: demotion and
//     verification; store_perm.go: the copies' modes and group;
//     store_dir.go: directory copies (vLLM's model), file by file;
//     store_use.go: marking a copy used, restoring it into an arena.
//   - plan.go: pure admission and eviction (PlanAdmit).
//   - predict.go: pure wake prediction and promotion plans.
//   - promote.go: wake and sleep records, promotion ahead of wakes.
//   - cold.go: cold sources (the model cache, S3); modelfile.go: a cold
//     model file verified against the fetcher's manifest;
//     sidecar_source.go: the model's files read through an engine's
//     sidecar where the agent cannot mount the cache.
//   - tmpfs.go: the hot tier's mount.
//   - report.go: the node report's probes (criu, the container runtime,
//     the tiers); noderuntime.go: the node's container runtime.
//   - criu.go: process snapshots; releaseproc.go: only a process of the
//     release's pods is snapshotted.
//   - bandwidth.go: bandwidth probes, also used by the benchmarks and
//     internal/tierprobe.
package nodeagent
