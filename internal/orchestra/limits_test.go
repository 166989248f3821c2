package orchestra

import (
	"strings"
	"testing"
)

func TestCheckMaxBodySize(t *testing.T) {
	for _, tt := range []struct {
		maxBody int64
		wantErr string
	}{
		{maxBody: 8 << 20}, // the default, 8Mi
		{maxBody: MaxQueuedBodyBytes},
		{maxBody: MaxQueuedBodyBytes + 1, wantErr: "spec.gateway.limits.maxBodySize: 9433089 bytes is more than the queue carries: at most 9433088"},
		{maxBody: NATSMaxPayload, wantErr: "more than the queue carries"},
	} {
		err := checkMaxBodySize(tt.maxBody)
		if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("checkMaxBodySize(%d) = %v, want %q", tt.maxBody, err, tt.wantErr)
		}
	}
}
