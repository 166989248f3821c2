package gateway

// The model list: GET /v1/models and GET /v1/models/{model}.

import "net/http"

// modelObject is one entry of GET /v1/models.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (g *Gateway) modelObject(m *ModelConfig) modelObject {
	return modelObject{ID: m.Name, Object: "model", Created: g.created, OwnedBy: m.OwnedBy}
}

// listModels serves GET /v1/models: the served models the caller may use.
func (g *Gateway) listModels(w http.ResponseWriter, r *http.Request) {
	p, err := g.authenticate(r)
	if err != nil {
		g.writeSimpleError(w, err)
		return
	}
	list := struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{Object: "list", Data: []modelObject{}}
	for i := range g.cfg.Models {
		if m := &g.cfg.Models[i]; p.mayUse(m.Name) {
			list.Data = append(list.Data, g.modelObject(m))
		}
	}
	writeJSON(w, http.StatusOK, list)
}

// getModel serves GET /v1/models/{model}.
func (g *Gateway) getModel(w http.ResponseWriter, r *http.Request) {
	p, err := g.authenticate(r)
	if err != nil {
		g.writeSimpleError(w, err)
		return
	}
	name := r.PathValue("model")
	m, ok := g.models[name]
	if !ok || !p.mayUse(name) {
		g.writeSimpleError(w, modelNotFound(name, ok))
		return
	}
	writeJSON(w, http.StatusOK, g.modelObject(m))
}
