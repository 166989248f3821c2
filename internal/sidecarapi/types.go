// Package sidecarapi is the wire protocol of the per-engine sidecar
// (orchestra-agent --role sidecar, internal/sidecar): the
// states and the status it reports, and the one client the lifecycle
// leader and the seat groups drive it with. Both sides import it; it
// imports nothing of either.
//
// The sidecar's HTTP API:
//
//	GET  /state          200 with the Status
//	POST /sleep?level=N  drain, then sleep at level N; 200 with the Status; 409 when the
//	                     state does not allow it, the engine did not drain, or a wake
//	                     overtook the sleep (nothing changed)
//	POST /wake           200 with the Status (with the engine's weights); 409 in a state
//	                     that does not allow it
//	POST /restart        restart the asleep engine in place; 200 with the Status; 409, or
//	                     501 when the engine cannot be restarted in place
//	GET  /readyz         200 only when Awake (the engine container's readiness)
//	GET  /healthz        200 while the sidecar runs
//	GET  /model/files[/{path}]  with model copies: the model's files, for the node agent
//	                     (caller token required; modelfiles.go)
//
// Files:
//   - types.go: State, Status, Transition, Transfer, ModelCopy, RestartReport, StopReport.
//   - client.go: Client, Error, ErrConflict.
//   - modelfiles.go: ModelFiles, GET /model/files and the client's
//     ModelFiles and OpenModelFile.
package sidecarapi

import (
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// State is what the sidecar reports about its engine. Only Awake
// takes traffic: readiness fails in every other state, so a sleeping root
// leaves the EndpointSlice, and the dispatcher sends only to Awake sidecars.
type State string

const (
	// Unknown: the engine has not answered yet.
	Unknown State = "Unknown"
	// Awake: the engine serves.
	Awake State = "Awake"
	// Draining: a sleep waits for the engine's in-flight requests to
	// finish. A wake arriving now abandons the sleep.
	Draining State = "Draining"
	// FallingAsleep: the engine's sleep call is running.
	FallingAsleep State = "FallingAsleep"
	// Asleep: the engine sleeps (weights in the hot tier at level 1).
	Asleep State = "Asleep"
	// Waking: the engine's wake call is running.
	Waking State = "Waking"
	// Failed: a sleep or wake left the engine in a state the sidecar
	// cannot tell; the lifecycle loop should restart the pod.
	Failed State = "Failed"
	// Restarting: POST /restart runs: the engine's processes are
	// stopping, or its container is starting again and has not answered,
	// or the restarted engine is being put to sleep.
	Restarting State = "Restarting"
)

var States = []State{Unknown, Awake, Draining, FallingAsleep, Asleep, Waking, Failed, Restarting}

// Transition records one sleep or wake.
type Transition struct {
	Level   int       `json:"level,omitempty"`
	At      time.Time `json:"at"`
	Seconds float64   `json:"seconds"`
	Error   string    `json:"error,omitempty"`
	// Transfer is what the engine reported moving, when it reports it:
	// the simulator does, and for Ollama and llama.cpp with model copies
	// the sidecar reports the copy of the model file a wake loaded; vLLM
	// reports nothing.
	Transfer *Transfer `json:"transfer,omitempty"`
}

// Transfer is the weights an engine moved in one sleep or wake, as the
// engine reports it.
type Transfer struct {
	// Tier the bytes moved to (sleep) or from (wake): Hot, Warm or Cold
	// (earlier releases' lowercase spelling decodes too).
	Tier  v1alpha1.Tier `json:"tier,omitempty"`
	Bytes int64         `json:"bytes"`
	// Verified is true when the restored bytes hashed to the digest
	// recorded when the engine first loaded them.
	Verified bool `json:"verified,omitempty"`
}

// Status is the body of GET /state.
type Status struct {
	State  State           `json:"state"`
	Engine v1alpha1.Engine `json:"engine"`
	// Level is the sleep level while not Awake.
	Level     int         `json:"level,omitempty"`
	Since     time.Time   `json:"since"`
	LastError string      `json:"lastError,omitempty"`
	LastSleep *Transition `json:"lastSleep,omitempty"`
	LastWake  *Transition `json:"lastWake,omitempty"`
	Sleeps    int         `json:"sleeps"`
	Wakes     int         `json:"wakes"`
	// Digest is the digest the engine recorded when it loaded its weights
	// (xxh3c:…), which every restore and every demotion of them must match;
	// empty when the engine does not report it (only the simulator does).
	Digest string `json:"digest,omitempty"`
	// ResidentBytes is the engine's memory holding weights right now, as
	// the engine reports it (the simulator's
	// orchestra_sim_weights_resident_bytes): 0 after a sleep that freed
	// its memory. Omitted when the engine does not report it.
	ResidentBytes *int64 `json:"residentBytes,omitempty"`
	// WeightsBytes is the size of the engine's weights, against which
	// ResidentBytes is judged; omitted when the engine does not report it.
	WeightsBytes *int64 `json:"weightsBytes,omitempty"`
	// WeightsError says why the engine's weights (ResidentBytes,
	// WeightsBytes) could not be read for this answer, from an engine that
	// reports them.
	WeightsError string `json:"weightsError,omitempty"`
	// MemorySource says where ResidentBytes comes from: "nvidia-smi" (the
	// device memory of the engine container's processes) or "engine" (the
	// engine's own report); empty when neither reported it.
	MemorySource string `json:"memorySource,omitempty"`
	// DeviceMemoryError says why the device memory could not be read for
	// this answer, when the sidecar reads it (--nvidia-smi); ResidentBytes
	// then falls back to the engine's report.
	DeviceMemoryError string `json:"deviceMemoryError,omitempty"`
	// Model is the copy of the model file the engine loads, when the
	// sidecar points the engine at the hottest verified copy on its node
	// (Ollama, llama.cpp): while Awake the copy the engine loaded last,
	// otherwise the copy its next wake will load. Omitted for engines the
	// sidecar does not point (the simulator, vLLM).
	Model *ModelCopy `json:"model,omitempty"`
	// Restarts counts the engine restarts this sidecar made (POST /restart).
	Restarts int `json:"restarts,omitempty"`
	// LastRestart is how the last restart went.
	LastRestart *RestartReport `json:"lastRestart,omitempty"`
}

// ModelCopy is one copy of an engine's model (a file, or vLLM's
// directory) on its node.
type ModelCopy struct {
	// Tier is Hot (the node agent's RAM tier), Warm (its disk tier) or
	// Cold (the model cache).
	Tier v1alpha1.Tier `json:"tier"`
	// Path is the file as the engine container sees it.
	Path string `json:"path"`
	// Bytes is the file's size.
	Bytes int64 `json:"bytes"`
	// SHA256 is the fetcher's manifest sha256 the copy was verified
	// against (empty when the manifest lists none, and for a directory).
	SHA256 string `json:"sha256,omitempty"`
	// Files is the number of files of a model directory (vLLM's), each
	// verified against the manifest's sha256; 0 for one model file.
	Files int `json:"files,omitempty"`
}

// Restart routes (RestartReport.Via).
const (
	// RestartViaEngine: the engine restarted itself in place (the
	// simulator with --restartable).
	RestartViaEngine = "engine"
	// RestartViaProcess: the sidecar stopped the engine container's processes
	// and the kubelet started the container again.
	RestartViaProcess = "process"
)

// RestartReport is how one engine restart went.
type RestartReport struct {
	Via string    `json:"via"`
	At  time.Time `json:"at"`
	// Seconds is the whole restart, until the engine answered asleep.
	Seconds float64 `json:"seconds"`
	// Stopped is the engine's processes the sidecar stopped (RestartViaProcess).
	Stopped *StopReport `json:"stopped,omitempty"`
	Error   string      `json:"error,omitempty"`
}

// StopReport says how the engine's processes ended.
type StopReport struct {
	// PIDs are the processes stopped, the container's main process first.
	PIDs []int `json:"pids"`
	// Cmdline is the main process's command line.
	Cmdline string `json:"cmdline"`
	// Killed is true when SIGTERM was not enough within the grace period.
	Killed  bool    `json:"killed,omitempty"`
	Seconds float64 `json:"seconds"`
}
