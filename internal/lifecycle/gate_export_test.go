package lifecycle

// ServeWaitingPulls and PullNothing are serveWaitingPulls and pullNothing,
// for the gate's tests.
var (
	ServeWaitingPulls = serveWaitingPulls
	PullNothing       = pullNothing
)
