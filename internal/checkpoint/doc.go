// Package checkpoint is the orchestra-agent binary's code in both of its
// roles, until each moves to a package of its own:
//
//   - the per-engine sidecar (--role seat; "sidecar" below): it drives one
//     engine's own sleep and wake API, drains it first, reports its state
//     (the wire types and the client are internal/sidecarapi) and gates the
//     engine container's readiness;
//   - the node agent (--role node): it owns the node's hot (tmpfs) and warm
//     (disk) tiers within byte budgets, copies and verifies the weights
//     between them and the cold tier (the model cache or S3), predicts
//     wakes and promotes ahead of them, reports what the node can do, and
//     takes process snapshots where criu works. Its wire types (the
//     tiers, keys and copies, its requests, records and report), the
//     authentication of its callers and its client are internal/nodeapi.
//
// docs/checkpoint.md is the reference of both roles.
//
// Files, by role:
//
//	both      config.go (Config, defaults, Validate), run.go (Run, Start),
//	          metrics.go (metrics, JSON requests and answers), wire.go
//	          (nodeapi's wire types under their old names)
//	sidecar   seat.go (the sidecar's state machine and HTTP API),
//	          seat_restart.go (restarting an engine in place), modelcopy.go
//	          (pointing the engine at the hottest verified model file),
//	          engine.go (the Engine interface, NewEngine), vllm.go, ollama.go,
//	          llamacpp.go (one adapter per engine), process.go (an engine's
//	          processes: restart, the engine matchers), devicemem.go
//	          (nvidia-smi readings)
//	node      node.go (the node agent and its HTTP API), node_snapshot.go (its
//	          process snapshot endpoint), store.go (the tiers
//	          on disk), store_demote.go (demotion, verification), plan.go
//	          (pure: admission and eviction), predict.go (pure: wake
//	          prediction, promotion plans), promote.go (wake and
//	          sleep records, promotion ahead), cold.go (cold sources: model
//	          cache, S3), modelfile.go (a cold model file verified against
//	          the fetcher's manifest), tmpfs.go (the hot tier's mount), report.go (the node
//	          report), noderuntime.go (the node's container runtime),
//	          criu.go (process snapshots), releaseproc.go (only a
//	          process of the release's pods is snapshotted), bandwidth.go (bandwidth probes,
//	          also used by the benchmarks)
//	arena/    memory regions, hashing and the copy path of a restore
//	enginetest/ fakes of vLLM, Ollama and llama.cpp that quote their APIs
package checkpoint
