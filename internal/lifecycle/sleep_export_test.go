package lifecycle

import "time"

// SetRefreshEvery paces the resident-tier refresh in tests.
func SetRefreshEvery(d time.Duration) (restore func()) {
	old := refreshEvery
	refreshEvery = d
	return func() { refreshEvery = old }
}
