package v1alpha1

import (
	"encoding/json"
	"testing"
)

// The agents of the previous release spell the tiers in lowercase on the
// wire: a value or a map key in either spelling decodes to the one tier.
func TestTierDecodesEitherSpelling(t *testing.T) {
	var got struct {
		Tier Tier           `json:"tier"`
		Used map[Tier]int64 `json:"used"`
		List []Tier         `json:"list"`
	}
	in := `{"tier":"hot","used":{"hot":1,"Warm":2,"COLD":3},"list":["warm","Accelerator","accelerator","Cold","ssd"]}`
	if err := json.Unmarshal([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	if got.Tier != TierHot {
		t.Errorf("tier %q, want %q", got.Tier, TierHot)
	}
	if len(got.Used) != 3 || got.Used[TierHot] != 1 || got.Used[TierWarm] != 2 || got.Used[TierCold] != 3 {
		t.Errorf("used %v, want Hot 1, Warm 2, Cold 3", got.Used)
	}
	want := []Tier{TierWarm, TierAccelerator, TierAccelerator, TierCold, "ssd"}
	for i := range want {
		if i >= len(got.List) || got.List[i] != want[i] {
			t.Fatalf("list %q, want %q (an unknown name kept as it is)", got.List, want)
		}
	}
	// Encoding writes the one spelling.
	out, _ := json.Marshal(map[Tier]int64{TierHot: 1})
	if string(out) != `{"Hot":1}` {
		t.Errorf("encoded %s, want {\"Hot\":1}", out)
	}
}
