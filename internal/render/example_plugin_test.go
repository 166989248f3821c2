package render_test

import (
	"context"
	"encoding/json"
	"errors"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/internal/plugin"
)

// annotate is an example post-renderer: the whole of a plugin is a file like
// this one plus one registration line (see newRegistry):
//
//	reg.RegisterPostRenderer("annotate", newAnnotate)
type annotate struct {
	Key   string `json:"key"`
	Value string `json:"value"`

	// seen records the labels the plugin saw, to check the order of the chain.
	seen *[]map[string]string
}

func newAnnotate(config json.RawMessage) (plugin.PostRenderer, error) {
	a := &annotate{seen: new([]map[string]string)}
	if err := json.Unmarshal(config, a); err != nil {
		return nil, err
	}
	if a.Key == "" {
		return nil, errors.New("key must not be empty")
	}
	return a, nil
}

func (a *annotate) PostRender(_ context.Context, rc plugin.RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	for _, o := range objs {
		*a.seen = append(*a.seen, o.GetLabels())
		ann := o.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[a.Key] = a.Value + "/" + rc.Owner.GetName()
		o.SetAnnotations(ann)
	}
	return objs, nil
}

// greetingTranslator is an example values translator.
var greetingTranslator = plugin.TranslatorFunc(func(_ context.Context, obj *unstructured.Unstructured) (map[string]any, error) {
	who, _, _ := unstructured.NestedString(obj.Object, "spec", "who")
	if who == "" {
		return nil, errors.New("spec.who is required")
	}
	return map[string]any{"greeting": "hello " + who, "replicas": 2}, nil
})

func newRegistry() *plugin.Registry {
	reg := plugin.NewRegistry()
	reg.RegisterPostRenderer("annotate", newAnnotate)
	reg.RegisterTranslator("greeting", greetingTranslator)
	return reg
}
