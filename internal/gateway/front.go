package gateway

import (
	"net/http"
	"path"
)

// front is the gateway's outermost API handler. It serves every path in
// its clean form instead of letting http.ServeMux redirect to it: a path
// with "..", "." or "//" segments is served as the path it cleans to (an
// API route answers as such, anything else is the 404 OpenAI error of
// notFound), never with a redirect and an HTML body. A request whose path
// is not absolute (a CONNECT request's authority) is a 404 error as well,
// where the mux would answer plain text.
func (g *Gateway) front(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "" || p[0] != '/' {
			g.notFound(w, r)
			return
		}
		if c := cleanPath(p); c != p {
			r2 := *r
			u := *r.URL
			u.Path, u.RawPath = c, ""
			r2.URL = &u
			r = &r2
		}
		mux.ServeHTTP(w, r)
	})
}

// cleanPath is p with ".", ".." and empty segments resolved, as
// http.ServeMux cleans it (a trailing slash is kept).
func cleanPath(p string) string {
	c := path.Clean(p)
	if p[len(p)-1] == '/' && c != "/" {
		c += "/"
	}
	return c
}
