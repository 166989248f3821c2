package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Ollama unloads and preloads a model through Ollama's own API: an empty
// /api/generate with keep_alive 0 unloads it, one with the policy's
// keep_alive loads it, /api/ps lists what is loaded. The weights stay in the
// node's page cache after an unload, so a reload reads them from RAM when the
// node has room.
type Ollama struct {
	httpEngine
	model     string
	keepAlive string
}

// Name implements Engine.
func (o *Ollama) Name() v1alpha1.Engine { return v1alpha1.EngineOllama }

// InFlight is unknown: Ollama exposes no request gauge. The sidecar relies on
// the dispatcher's drain fence.
func (o *Ollama) InFlight(context.Context) (int, error) { return -1, nil }

func keepAliveValue(s string) any {
	if d, err := time.ParseDuration(s); err == nil && s != "-1" && s != "0" {
		return d.String()
	}
	n := json.Number(s)
	if _, err := n.Int64(); err == nil {
		return n
	}
	return s
}

// Sleep unloads the model (both levels: Ollama has one way to let go).
func (o *Ollama) Sleep(ctx context.Context, _ int) error {
	if err := o.call(ctx, http.MethodPost, "/api/generate", map[string]any{"model": o.model, "keep_alive": 0}, nil); err != nil {
		return fmt.Errorf("unloading %s: %w", o.model, err)
	}
	return o.waitFor(ctx, "ollama to unload "+o.model, func() (bool, error) {
		s, err := o.Sleeping(ctx)
		return s, err
	})
}

// Wake preloads the model once Ollama has it: the engine's start creates the
// model from its file after the server answers (the chart's ollama script),
// so a wake that comes first (a pod woken from zero, an engine restart)
// waits for the create instead of reading Ollama's "model not found" as a
// copy it cannot load. The load runs on a context that the caller's
// cancellation does not reach, with its own bound: Ollama aborts a load when
// its client disconnects (ollama/ollama#7408), and a half-done wake must
// not leave the engine unloaded.
func (o *Ollama) Wake(ctx context.Context) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(v1alpha1.EngineWakeTimeout)
	}
	lctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	if err := o.waitFor(lctx, "ollama to have the model "+o.model+" (the engine creates it from its model file as it starts)", func() (bool, error) { return o.created(lctx) }); err != nil {
		return err
	}
	body := map[string]any{"model": o.model, "keep_alive": keepAliveValue(o.keepAlive)}
	if err := o.call(lctx, http.MethodPost, "/api/generate", body, nil); err != nil {
		return fmt.Errorf("preloading %s: %w", o.model, err)
	}
	asleep, err := o.Sleeping(lctx)
	if err != nil {
		return err
	}
	if asleep {
		return fmt.Errorf("ollama answered the preload of %s but /api/ps does not list it", o.model)
	}
	return nil
}

// Sleeping is true when /api/ps (the loaded models) does not list the model.
func (o *Ollama) Sleeping(ctx context.Context) (bool, error) {
	loaded, err := o.lists(ctx, "/api/ps")
	if err != nil {
		return false, err
	}
	return !loaded, nil
}

// ollamaName is a model name as Ollama lists it in /api/ps (types/model:
// ParseName, then DisplayShortest, v0.17.4): a missing tag is "latest", and
// the default host registry.ollama.ai and namespace library are left out.
// `ollama create tiny` makes "tiny:latest"; Ollama compares names ignoring
// case.
func ollamaName(name string) string {
	s, tag := name, "latest"
	if i := strings.LastIndex(s, ":"); i > strings.LastIndex(s, "/") {
		s, tag = s[:i], s[i+1:]
	}
	host, ns, model := "registry.ollama.ai", "library", s
	if i := strings.LastIndex(s, "/"); i >= 0 {
		ns, model = s[:i], s[i+1:]
		if j := strings.LastIndex(ns, "/"); j >= 0 {
			host, ns = ns[:j], ns[j+1:]
		}
	}
	switch {
	case !strings.EqualFold(host, "registry.ollama.ai"):
		return host + "/" + ns + "/" + model + ":" + tag
	case !strings.EqualFold(ns, "library"):
		return ns + "/" + model + ":" + tag
	}
	return model + ":" + tag
}

// created is true when GET /api/tags lists the model (Ollama's list of the
// models it has, loaded or not; it reads no model file).
func (o *Ollama) created(ctx context.Context) (bool, error) {
	return o.lists(ctx, "/api/tags")
}

// lists is true when the model list at path names the model.
func (o *Ollama) lists(ctx context.Context, path string) (bool, error) {
	var list struct {
		Models []struct {
			Name  string `json:"name"`
			Model string `json:"model"`
		} `json:"models"`
	}
	if err := o.call(ctx, http.MethodGet, path, nil, &list); err != nil {
		return false, err
	}
	want := ollamaName(o.model)
	for _, m := range list.Models {
		if strings.EqualFold(ollamaName(m.Name), want) || strings.EqualFold(ollamaName(m.Model), want) {
			return true, nil
		}
	}
	return false, nil
}
