// Package sim is an inference-engine simulator that speaks vLLM's
// OpenAI-compatible HTTP API. It produces deterministic text at a configurable
// pace, exports vLLM-style Prometheus metrics and can inject faults (errors,
// hangs, crashes), so the gateway, the dispatcher and the operator can be
// tested and benchmarked without GPUs.
//
// Use it in-process with New(cfg).Handler(), or as a server with Run.
//
// Sleep and wake follow vLLM's development API (POST /sleep?level=1|2,
// /wake_up, /collective_rpc reload_weights, GET /is_sleeping), with real
// weights: a level-1 sleep offloads them to the hot tier, a wake restores
// them from the fastest tier that holds a verified copy and reports where
// they came from (StageReport, in the API's tier names).
//
// Files:
//   - config.go: Config, its defaults and validation.
//   - sim.go: Simulator, New and its options, the device pool, the HTTP
//     routes.
//   - serve.go: the OpenAI endpoints (chat and text completions,
//     embeddings, models).
//   - stream.go: one generation: admission, faults, pacing, the answer.
//   - openai.go: the OpenAI request and response shapes.
//   - httpio.go: JSON answers, errors and the SSE writer.
//   - generate.go: the deterministic text.
//   - prefix.go: PrefixCache, vLLM's automatic prefix caching.
//   - metrics.go: the vLLM-named metrics and the sleep/wake stages.
//   - weights.go: the engine's weights and state, StageReport,
//     WeightsStatus.
//   - sleep.go: sleep, wake and reload_weights (vLLM's sleep API).
//   - restore.go: where a wake's weights come from (device, offload,
//     tiers), verified.
//   - run.go: Run, the server.
package sim
