// Package seatgroup multiplexes several applications onto one accelerator:
// the applications of a seat group share activeSeats seats, and only the
// applications holding a seat are awake. The others sleep (their weights in
// the hot tier, their requests in the queue) until the policy swaps them in.
//
// Decide is the policy, a pure function from one observation of the group
// to an ordered plan of actions. The Executor observes the group, asks
// Decide for a plan and applies it against the applications' sidecars
// (the per-engine agents, through internal/sidecarapi's client), the
// dispatcher's gate and a memory reading, and exports what it does as
// Prometheus metrics. "Seat" here is always an accelerator seat; the agent
// beside each engine is its sidecar. internal/lifecycle runs one Executor
// per group pod on the lifecycle leader. docs/checkpoint.md
// ("Multiplexing") describes the rules.
//
// Files:
//
//	doc.go       this overview
//	policy.go    Decide: the pure policy, table-tested (policy_test.go)
//	executor.go  Executor: observe, Decide, apply; the Sidecar, Dispatcher,
//	             MemoryReader and Restarter interfaces
//	config.go    Config, defaults and validation
//	memory.go    the memory reading over a sidecar's status
//	metrics.go   the executor's metrics
//	seatgrouptest/  a test harness: a group of simulator engines with their
//	                sidecars and a queueing dispatcher
//	simengine/      a restartable simulator engine for group pods
package seatgroup
