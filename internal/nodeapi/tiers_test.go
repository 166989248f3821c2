package nodeapi_test

import (
	"testing"

	"github.com/model-orchestra/operator/internal/nodeapi"
)

// A key names a directory and a file in it: anything that could leave the
// namespace's directory, or hide as a dot file, is refused.
func TestKeyValidate(t *testing.T) {
	for _, k := range []nodeapi.Key{
		{Namespace: "", Name: "x"},
		{Namespace: "Team", Name: "x"},
		{Namespace: "ns", Name: ""},
		{Namespace: "ns", Name: "../x"},
		{Namespace: "ns", Name: ".hidden"},
		{Namespace: "ns", Name: "a/b"},
	} {
		if err := k.Validate(); err == nil {
			t.Errorf("%+v is valid", k)
		}
	}
	if err := (nodeapi.Key{Namespace: "team-a", Name: "model.gguf"}).Validate(); err != nil {
		t.Error(err)
	}
}
