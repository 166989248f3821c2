package orchestra

import (
	"context"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/plugin"
)

// A model the fetcher found too large for its engine's memory limit makes
// ModelReady False with reason ModelTooLarge and the fetcher's numbers;
// every sized model shows in status.modelSize (kubectl get's Size column).
func TestStatusModelTooLarge(t *testing.T) {
	sizing := `"sizing":{"architecture":"llama","parameters":1100000000,"weightType":"Q8_0","contextLength":2048,"fileBytes":1170000000,"context":2048,"parallel":4,"memoryBytes":1500000000,"memoryLimitBytes":1073741824,"marginPercent":10,"fits":%s}`
	tooLarge := `{"phase":"Failed","message":"verification failed: the model does not fit the engine''s memory limit: llama Q8_0 (1.1B parameters, 1.1GiB file) needs about 1.4GiB for 2048-token context × 4 sequences, 1.5GiB with the 10% margin; the limit is 1.0GiB",` + strings.Replace(sizing, "%s", "false", 1) + `}`
	fits := `{"phase":"Complete","bytesDone":1000,"bytesTotal":1000,"files":2,"filesDone":2,"verified":true,` + strings.Replace(sizing, "%s", "true", 1) + `}`
	objs := append(stack(t, 1), progress(t, "chat", tooLarge), progress(t, "big", fits))
	res, err := Status{}.Status(context.Background(), plugin.StatusInput{Owner: owner(t, twoApps), Objects: objs})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, c := range res.Conditions {
		if c.Type != "ModelReady" {
			continue
		}
		found = true
		if c.Status != "False" || c.Reason != "ModelTooLarge" || !strings.Contains(c.Message, "the limit is 1.0GiB") || !strings.Contains(c.Message, "chat:") {
			t.Errorf("ModelReady = %s %s %q", c.Status, c.Reason, c.Message)
		}
	}
	if !found {
		t.Fatal("no ModelReady condition")
	}
	got, _ := res.Fields["modelSize"].(string)
	for _, want := range []string{"big: 1.1B Q8_0 1.1GiB, needs 1.4GiB", "chat: 1.1B Q8_0 1.1GiB, needs 1.4GiB (limit 1.0GiB)"} {
		if !strings.Contains(got, want) {
			t.Errorf("modelSize %q lacks %q", got, want)
		}
	}
}
