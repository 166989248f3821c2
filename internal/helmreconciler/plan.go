package helmreconciler

import (
	"fmt"

	"helm.sh/helm/v3/pkg/release"
)

// revisionInfo is what planning needs to know about one stored revision.
type revisionInfo struct {
	Revision int
	Status   release.Status
	Digest   string
}

// step is the Helm action a reconcile takes.
type step int

const (
	stepNone    step = iota // the latest revision is deployed with the wanted digest
	stepInstall             // install (after purging a failed or stale first install)
	stepUpgrade             // upgrade from the last deployed revision
)

func (s step) String() string {
	return [...]string{"none", "install", "upgrade"}[s]
}

// plan is the outcome of planRelease.
type plan struct {
	Step step
	// PurgeFirst: remove the release (its objects and history) before
	// installing, because the first install failed or was interrupted.
	PurgeFirst bool
	// MarkFailed is the revision left pending by an interrupted action, to
	// be marked failed before upgrading.
	MarkFailed int
	// Recovered describes a recovery from an interrupted or failed action,
	// for events and logs.
	Recovered string
}

// planRelease decides what to do given the stored revisions (any order) and
// the digest of the wanted inputs. The engine holds the only writer of a
// release (one leader, one worker per resource), so a revision still pending
// when a reconcile starts was left by an operator that was killed mid-action.
func planRelease(history []revisionInfo, digest string) plan {
	if len(history) == 0 {
		return plan{Step: stepInstall}
	}
	latest := history[0]
	deployed := false
	for _, h := range history {
		if h.Revision > latest.Revision {
			latest = h
		}
		if h.Status == release.StatusDeployed {
			deployed = true
		}
	}
	switch {
	case latest.Status == release.StatusDeployed:
		if latest.Digest == digest {
			return plan{Step: stepNone}
		}
		return plan{Step: stepUpgrade}
	case latest.Status.IsPending() || latest.Status == release.StatusUninstalling:
		if deployed && latest.Status != release.StatusPendingInstall && latest.Status != release.StatusUninstalling {
			return plan{Step: stepUpgrade, MarkFailed: latest.Revision,
				Recovered: fmt.Sprintf("revision %d was left %s; marked failed and upgrading", latest.Revision, latest.Status)}
		}
		return plan{Step: stepInstall, PurgeFirst: true,
			Recovered: fmt.Sprintf("revision %d was left %s; purged and installing again", latest.Revision, latest.Status)}
	case latest.Status == release.StatusUninstalled:
		return plan{Step: stepInstall}
	default: // failed, superseded, unknown
		if deployed {
			return plan{Step: stepUpgrade}
		}
		return plan{Step: stepInstall, PurgeFirst: true,
			Recovered: fmt.Sprintf("revision %d is %s and none is deployed; purged and installing again", latest.Revision, latest.Status)}
	}
}
