package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// LlamaCPP drives llama-server in router mode: POST /models/unload and
// POST /models/load with {"model": name}, and GET /models, whose entries
// carry status.value (unloaded, loading, loaded, sleeping). With SlotSave it
// saves slot 0's prompt cache before unloading and restores it after loading
// (POST /slots/0?action=save|restore; the server needs --slot-save-path).
type LlamaCPP struct {
	httpEngine
	model    string
	slotSave bool
}

// Name implements Engine.
func (l *LlamaCPP) Name() v1alpha1.Engine { return v1alpha1.EngineLlamaCPP }

// InFlight reads llamacpp:requests_processing + llamacpp:requests_deferred.
func (l *LlamaCPP) InFlight(ctx context.Context) (int, error) {
	n, found, err := l.promGauges(ctx, "llamacpp:requests_processing", "llamacpp:requests_deferred")
	if err != nil || !found {
		return -1, err
	}
	return int(n), nil
}

func (l *LlamaCPP) slotFile() string { return l.model + ".slot0.bin" }

// Sleep saves the prompt cache (optional) and unloads the model.
func (l *LlamaCPP) Sleep(ctx context.Context, _ int) error {
	if l.slotSave {
		if err := l.call(ctx, http.MethodPost, "/slots/0?action=save", map[string]string{"filename": l.slotFile()}, nil); err != nil {
			return fmt.Errorf("saving the prompt cache: %w", err)
		}
	}
	if err := l.call(ctx, http.MethodPost, "/models/unload", map[string]string{"model": l.model}, nil); err != nil {
		return fmt.Errorf("unloading %s: %w", l.model, err)
	}
	return l.waitFor(ctx, "llama-server to unload "+l.model, func() (bool, error) { return l.Sleeping(ctx) })
}

// Wake loads the model, waits until it is loaded and restores the prompt
// cache (optional; a missing cache file is not an error).
func (l *LlamaCPP) Wake(ctx context.Context) error {
	if err := l.call(ctx, http.MethodPost, "/models/load", map[string]string{"model": l.model}, nil); err != nil {
		return fmt.Errorf("loading %s: %w", l.model, err)
	}
	if err := l.waitFor(ctx, "llama-server to load "+l.model, func() (bool, error) {
		s, err := l.status(ctx)
		if s == "failed" {
			return false, fmt.Errorf("llama-server failed to load %s", l.model)
		}
		return s == "loaded", err
	}); err != nil {
		return err
	}
	if l.slotSave {
		err := l.call(ctx, http.MethodPost, "/slots/0?action=restore", map[string]string{"filename": l.slotFile()}, nil)
		var ee *EngineError
		if err != nil && (!errors.As(err, &ee) || ee.Status != http.StatusNotFound) {
			return fmt.Errorf("restoring the prompt cache: %w", err)
		}
	}
	return nil
}

// Sleeping is true unless GET /models reports the model loaded.
func (l *LlamaCPP) Sleeping(ctx context.Context) (bool, error) {
	s, err := l.status(ctx)
	if err != nil {
		return false, err
	}
	return s != "loaded", nil
}

func (l *LlamaCPP) status(ctx context.Context) (string, error) {
	var r struct {
		Data []struct {
			ID     string `json:"id"`
			Status struct {
				Value  string `json:"value"`
				Failed bool   `json:"failed"`
			} `json:"status"`
		} `json:"data"`
	}
	if err := l.call(ctx, http.MethodGet, "/models", nil, &r); err != nil {
		return "", err
	}
	for _, m := range r.Data {
		if m.ID == l.model {
			if m.Status.Failed {
				return "failed", nil
			}
			return m.Status.Value, nil
		}
	}
	return "", fmt.Errorf("GET /models does not list %s (is it in --models-dir?)", l.model)
}
