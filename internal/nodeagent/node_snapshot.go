package nodeagent

import (
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/model-orchestra/operator/internal/agenthttp"
	"github.com/model-orchestra/operator/internal/engineproc"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// The node agent's process snapshot endpoint.

// SnapshotSupport says whether this node can take process snapshots, and
// why not.
func (n *Node) SnapshotSupport() (bool, string) {
	n.mu.Lock()
	r := n.report
	n.mu.Unlock()
	switch {
	case n.cfg.SnapshotDir == "":
		return false, "process snapshots are off: no --snapshot-dir"
	case r.Time.IsZero():
		return false, "the node has not been probed yet"
	case !r.CRIU.CheckPassed:
		return false, "criu: " + r.CRIU.Reason
	}
	return true, ""
}

func (n *Node) criu() CRIU {
	n.mu.Lock()
	defer n.mu.Unlock()
	return CRIU{Bin: n.cfg.CRIU, Report: n.report.CRIU}
}

func (n *Node) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	k := nodeapi.Key{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	if err := n.store.CheckKey(k); err != nil {
		agenthttp.WriteError(w, keyErrorStatus(err), err.Error())
		return
	}
	if ok, why := n.SnapshotSupport(); !ok {
		agenthttp.WriteError(w, http.StatusNotImplemented, fmt.Sprintf("%v: %s", ErrSnapshotsUnsupported, why))
		return
	}
	restore := strings.HasSuffix(r.URL.Path, "/restore")
	pid := 0
	if !restore {
		var perr error
		pid, perr = strconv.Atoi(r.URL.Query().Get("pid"))
		if perr != nil || pid <= 1 {
			agenthttp.WriteError(w, http.StatusBadRequest, "pid must be the process to snapshot (an integer above 1)")
			return
		}
		if err := engineproc.IsEngineProcess(engineproc.ProcFS{}, pid); err != nil {
			agenthttp.WriteError(w, http.StatusForbidden, err.Error())
			return
		}
		if err := n.owner.CheckProcess(r.Context(), pid); err != nil {
			status := http.StatusForbidden
			if !errors.Is(err, ErrNotOfRelease) {
				status = http.StatusServiceUnavailable // the pod list could not be read
			}
			n.log.Warn("process snapshot refused", "key", k.String(), "pid", pid, "err", err)
			agenthttp.WriteError(w, status, err.Error())
			return
		}
	}
	dir := filepath.Join(n.cfg.SnapshotDir, k.Namespace, k.Name)
	var st SnapshotStats
	var err error
	if restore {
		st, err = n.criu().Restore(r.Context(), dir)
	} else {
		st, err = n.criu().Dump(r.Context(), pid, dir)
	}
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, ErrSnapshotsUnsupported) {
			status = http.StatusNotImplemented
		}
		n.log.Warn("process snapshot failed", "key", k.String(), "err", err)
		agenthttp.WriteError(w, status, err.Error())
		return
	}
	agenthttp.WriteJSON(w, http.StatusOK, st)
}
