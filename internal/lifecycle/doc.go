// Package lifecycle is the lifecycle leader: it scales applications with
// their demand, takes an idle application to zero pods or puts its engines
// to sleep, wakes it at once when a request arrives, scales it between one
// and maxReplicas replicas with its backlog, and multiplexes the
// applications of seat groups onto their accelerator seats.
//
// It runs inside the dispatcher (see internal/dispatch): every dispatcher
// replica watches the requests published for the orchestra, and the one
// holding the lifecycle Lease is the single writer of the replica count of
// the applications' root and worker StatefulSets, through their scale
// subresource. Requests never wait in a proxy: they stay in the JetStream
// stream, and the dispatcher takes them only when a root is ready, so a
// request for a sleeping application is delayed, never lost.
//
// # One step of an application
//
// Each application has one goroutine on the leader. A step observes
// (observeStep: the informers' cache, the consumer's demand through the one
// reader readConsumer, the root pods' sidecars when the state needs them),
// plans with the pure Decide(Observation) []Action over the states Zero,
// Waking, Draining, Asleep and Awake (plan.go has the transitions), applies
// the plan in order (execute), and writes the application's status once
// (writeStatus): to the lifecycle key-value bucket, which gateways watch
// (codec and watcher in internal/lifecyclestate), and to an annotation on
// the root StatefulSet, from which the operator reports it in the
// resource's status.
//
// # The gate
//
// The gate is the application's JetStream consumer, paused on the server
// (so it holds for every dispatcher replica) from the decision to go to
// zero or to sleep until a root serves again; gate.go is its only writer,
// and Gate its one typed state (a consumer's, and a seat-group pod's for
// one application). Going to zero: the consumer is paused, and only if then
// nothing is queued or in flight are the pods scaled to zero; a request
// that arrives before that cancels the drain, one that arrives after it
// wakes the application again.
//
// # Sidecars and seats
//
// "Sidecar" is the per-engine agent in each root pod (orchestra-agent
// --role=sidecar, wire types and client in internal/sidecarapi); "seat" is an
// accelerator seat of a seat group, which internal/seatgroup's Decide
// hands out and its Executor applies through the members' sidecars. The
// leader calls every sidecar, an application's roots and a group pod's
// members alike, through one driver (sidecars.go) and reads their states
// as sidecarapi.State; an application's status is written once per step,
// and so is each seat-group member's (after each group pod's step).
//
// Files:
//
//	doc.go               this overview
//	config.go            Config, App, SeatGroup, defaults and validation
//	controller.go        Controller: leader election, informers, the loops
//	app.go               an application's state, its take-over (initApp),
//	                     what the executor does to scale, drain and wake
//	app_apply.go         state, status (writeStatus, persist), scale, events
//	plan.go              Observation, Action, Decide: the pure step
//	step.go              observeStep, execute: one step of an application
//	demand.go            readConsumer: the one reader of a consumer's demand
//	leaseuse.go          the gateways' direct-lane lease use reports
//	gate.go              the gates, their one owner: the consumer pause
//	                     (consumerGate), a group pod's gates and the
//	                     SeatServingAnnotation (applyGates)
//	sidecars.go          the one driver of the sidecars: callSidecar,
//	                     onSidecars, readStates, rootSidecars
//	fence.go             the fence between a scale to zero and the next wake
//	earlyready.go        a starting root taken the moment its engine answers
//	firsttoken.go        a wake's first token, published by any dispatcher
//	sleep.go             sleepAfter: engines fall asleep in their pods and wake
//	sleep_config.go      SleepConfig, Weights (shared with SeatMember), defaults, validation
//	sleep_park.go        parkAfter: the hot offload demoted to the warm tier
//	sleep_copies.go      model copies: the node agents asked for the hot and
//	                     warm copies of engines that load their model file
//	park.go              parkAfter: the pods scaled away, the copies kept (parked)
//	placement.go         the weights node labels a woken root pod prefers
//	sleep_adopt.go       a new leader adopts sleeping engines; restarts
//	sleep_agents.go      the calls of the node agents (nodeapi); the
//	                     ModelCheckpoint status
//	sleep_wakes.go       wake and sleep records for the node agents
//	seatgroup_leader.go  seat groups: seatgroup.Executor driven by the leader
//	seatgroup_pod.go     one group pod: its sidecars, its Dispatcher adapter
//	                     (the members' demand and gates)
//	seatgroup_status.go  the members' statuses, written once per pod step
//	seatserving.go       which pods of a seat group serve an application
//	metrics.go           the leader's metrics
//
// Tests: plan_test.go (Decide's table), lifecycle_env_test.go (the
// scale-to-zero fake cluster) with lifecycle_test.go, sleep_plane_test.go
// (a root with a real sidecar and node agent) with sleep_test.go and
// sleep_tiers_test.go and park_test.go, placement_internal_test.go (the
// node labels), seatgroup_plane_test.go (a group pod) with
// seatgroup_leader_test.go and seatgroup_agent_test.go.
package lifecycle
