package helmreconciler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/release"
)

func TestPlanRelease(t *testing.T) {
	rev := func(n int, s release.Status, d string) revisionInfo {
		return revisionInfo{Revision: n, Status: s, Digest: d}
	}
	tests := []struct {
		name    string
		history []revisionInfo
		want    plan
	}{
		{"nothing stored installs", nil, plan{Step: stepInstall}},
		{"deployed with the same digest does nothing", []revisionInfo{rev(1, release.StatusSuperseded, "a"), rev(2, release.StatusDeployed, "b")}, plan{Step: stepNone}},
		{"deployed with another digest upgrades", []revisionInfo{rev(1, release.StatusDeployed, "a")}, plan{Step: stepUpgrade}},
		{"history in any order", []revisionInfo{rev(2, release.StatusDeployed, "b"), rev(1, release.StatusSuperseded, "a")}, plan{Step: stepNone}},
		{"interrupted install is purged and installed", []revisionInfo{rev(1, release.StatusPendingInstall, "b")},
			plan{Step: stepInstall, PurgeFirst: true, Recovered: "revision 1 was left pending-install; purged and installing again"}},
		{"interrupted upgrade is marked failed and upgraded", []revisionInfo{rev(1, release.StatusDeployed, "a"), rev(2, release.StatusPendingUpgrade, "b")},
			plan{Step: stepUpgrade, MarkFailed: 2, Recovered: "revision 2 was left pending-upgrade; marked failed and upgrading"}},
		{"interrupted rollback is marked failed and upgraded", []revisionInfo{rev(1, release.StatusDeployed, "a"), rev(2, release.StatusFailed, "b"), rev(3, release.StatusPendingRollback, "a")},
			plan{Step: stepUpgrade, MarkFailed: 3, Recovered: "revision 3 was left pending-rollback; marked failed and upgrading"}},
		{"failed first install is purged", []revisionInfo{rev(1, release.StatusFailed, "b")},
			plan{Step: stepInstall, PurgeFirst: true, Recovered: "revision 1 is failed and none is deployed; purged and installing again"}},
		{"failed upgrade without rollback upgrades again", []revisionInfo{rev(1, release.StatusDeployed, "a"), rev(2, release.StatusFailed, "b")}, plan{Step: stepUpgrade}},
		{"uninstalled with kept history installs", []revisionInfo{rev(1, release.StatusUninstalled, "a")}, plan{Step: stepInstall}},
		{"interrupted uninstall is purged", []revisionInfo{rev(1, release.StatusUninstalling, "a")},
			plan{Step: stepInstall, PurgeFirst: true, Recovered: "revision 1 was left uninstalling; purged and installing again"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, planRelease(tc.history, "b"), cmp.AllowUnexported(plan{})); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFailureBackoffDelayDoublesUpToItsMaximum(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{1, 2 * time.Second}, {2, 4 * time.Second}, {3, 8 * time.Second}, {8, 256 * time.Second}, {9, 5 * time.Minute}, {100, 5 * time.Minute}} {
		if got := failureBackoffDelay(c.n); got != c.want {
			t.Errorf("failureBackoffDelay(%d) = %s, want %s", c.n, got, c.want)
		}
	}
}
