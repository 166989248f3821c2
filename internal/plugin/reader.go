package plugin

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

type readerKey struct{}

// WithReader returns a copy of ctx that carries r, the reader a Translator
// may use to read the live objects its values depend on (for example a
// policy a custom resource references by name). The engine passes its
// cached client; the offline preview passes a reader of the documents it
// was given beside the resource, or none.
//
// A Translator that reads live objects must also make the engine reconcile
// the resource when they change (a watch of their kind, mapped to the
// resources that reference them), since the values, and so the digest, are
// only computed on a reconcile.
func WithReader(ctx context.Context, r client.Reader) context.Context {
	return context.WithValue(ctx, readerKey{}, r)
}

// ReaderFrom returns the reader WithReader put into ctx, or nil: a
// Translator must then work without live objects.
func ReaderFrom(ctx context.Context) client.Reader {
	r, _ := ctx.Value(readerKey{}).(client.Reader)
	return r
}
