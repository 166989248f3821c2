package nodeagent

import "testing"

func TestConfigRefusesANegativeCopyGroup(t *testing.T) {
	c := DefaultNodeConfig()
	c.Store.Group = -1
	if err := c.Validate(); err == nil {
		t.Fatal("a negative copy group was accepted")
	}
}
