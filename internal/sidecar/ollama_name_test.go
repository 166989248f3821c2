package sidecar

import "testing"

func TestOllamaName(t *testing.T) {
	for in, want := range map[string]string{
		"tiny":                                  "tiny:latest",
		"tiny:latest":                           "tiny:latest",
		"llama3:8b":                             "llama3:8b",
		"library/llama3:8b":                     "llama3:8b",
		"registry.ollama.ai/library/llama3":     "llama3:latest",
		"me/tiny":                               "me/tiny:latest",
		"host.example:5000/team/tiny:v1":        "host.example:5000/team/tiny:v1",
		"host.example:5000/team/tiny":           "host.example:5000/team/tiny:latest",
		"registry.ollama.ai/someone/model:q4_0": "someone/model:q4_0",
	} {
		if got := ollamaName(in); got != want {
			t.Errorf("ollamaName(%q) = %q, want %q", in, got, want)
		}
	}
}
