package main

import (
	"bytes"
	"strings"
	"testing"
)

func run(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

const resource = `apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: cli}
spec:
  applications:
    chat: {model: {source: "hf://org/repo", file: m.gguf}}
`

func TestTemplateFromStdin(t *testing.T) {
	out, err := run(t, resource, "template", "-f", "-", "-n", "team", "--set", "spec.gateway.replicas=3")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: StatefulSet", "name: cli-gateway\n  namespace: team", "replicas: 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestTemplateRefusesInvalidResource(t *testing.T) {
	_, err := run(t, resource, "template", "-f", "-", "--set", "spec.applications.chat.runtime.engine=tgi")
	if err == nil || !strings.Contains(err.Error(), "spec.applications.chat.runtime.engine") {
		t.Fatalf("error = %v, want one naming spec.applications.chat.runtime.engine", err)
	}
}

func TestTemplateRefusesSmallNATSStorage(t *testing.T) {
	_, err := run(t, resource, "template", "-f", "-", "--set", "spec.nats.storage.size=1536Mi")
	if err == nil || !strings.Contains(err.Error(), "spec.nats.storage.size") || !strings.Contains(err.Error(), "at least 2Gi") {
		t.Fatalf("error = %v, want one naming spec.nats.storage.size and the 2Gi minimum", err)
	}
}

func TestTemplateNeedsFile(t *testing.T) {
	if _, err := run(t, "", "template"); err == nil || !strings.Contains(err.Error(), "--file") {
		t.Fatalf("error = %v, want one asking for --file", err)
	}
}
