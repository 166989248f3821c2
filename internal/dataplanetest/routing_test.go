package dataplanetest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
)

// TestPrefixRoutingWithTwoDispatchers runs multi-turn conversations through
// the gateway and two dispatchers with prefix routing over two simulators:
// each later turn reuses its conversation's previous prompt from the
// replica's prefix cache (usage.prompt_tokens_details.cached_tokens),
// whichever dispatcher takes it, because the dispatchers share their
// decisions. With least-loaded routing about half the turns miss.
func TestPrefixRoutingWithTwoDispatchers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS, two dispatchers and three simulators")
	}
	hits := func(policy string) (hit, turns int) {
		simCfg := dataplanetest.FastSim()
		var engines []string
		for range 2 {
			e, err := dataplanetest.StartEngine(simCfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.Close)
			engines = append(engines, e.URL)
		}
		s := startStack(t, simCfg, func(c *dataplanetest.StackConfig) {
			c.Dispatcher = func(d *dispatch.Config) {
				d.Apps[0].Endpoints = engines
				// A generous load bound and a negligible cost per request
				// in flight: the load trade-off is TestDecidePrefix's;
				// here every turn should find its root.
				d.Apps[0].Routing = dispatch.Routing{Policy: policy, LoadFactor: 8, LoadCost: 0.001}
			}
		})
		dispatcher(t, s)
		dispatcher(t, s)
		client := clientFor(s.Gateway.URL)
		system := strings.Repeat("You answer questions about the orchestra. ", 30)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for c := range 8 {
			wg.Go(func() {
				msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system)}
				prev := 0
				for turn := range 4 {
					msgs = append(msgs, openai.UserMessage(strings.Repeat(fmt.Sprintf("user %d asks question %d. ", c, turn), 10)))
					res, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "sim-model", Messages: msgs})
					if err != nil {
						t.Error(err)
						return
					}
					if turn > 0 {
						mu.Lock()
						turns++
						// The previous prompt's whole blocks are cached
						// only on the replica that served it.
						if int(res.Usage.PromptTokensDetails.CachedTokens) >= prev/16*16 {
							hit++
						}
						mu.Unlock()
					}
					prev = int(res.Usage.PromptTokens)
					msgs = append(msgs, openai.AssistantMessage(res.Choices[0].Message.Content))
				}
			})
		}
		wg.Wait()
		return hit, turns
	}
	hit, turns := hits(dispatch.RoutePrefix)
	if turns != 24 || hit < turns-1 {
		t.Errorf("prefix routing: %d of %d later turns found their previous prompt cached, want all (one may race the other dispatcher's update)", hit, turns)
	}
	ll, _ := hits(dispatch.RouteLeastLoaded)
	t.Logf("later turns with the previous prompt cached: prefix %d/%d, least-loaded %d/%d", hit, turns, ll, turns)
}
