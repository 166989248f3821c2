// Command relaypod is the plain HTTP relay of bench-engine's floor: a pod
// that passes each request on to the next address of its X-Relay-Via
// header (a comma-separated list of host:port; the last is the engine)
// and streams the answer back, flushing every write, with kept-alive
// connections to the next hop (httputil.ReverseProxy). Three of them in a
// row are the floor of the gateway, NATS and dispatcher pods a request
// through the queue crosses: the same number of process hops, with no
// work beyond relaying.
package main

import (
	"log"
	"net/http"
	"net/http/httputil"
	"os"
	"strings"
	"time"
)

// ViaHeader lists the hops still ahead of a request.
const ViaHeader = "X-Relay-Via"

func main() {
	addr := ":8080"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			next, rest, _ := strings.Cut(r.In.Header.Get(ViaHeader), ",")
			r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = "http", next, next
			if rest == "" {
				r.Out.Header.Del(ViaHeader)
			} else {
				r.Out.Header.Set(ViaHeader, rest)
			}
		},
		FlushInterval: -1,
		Transport:     &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.Handle("/", proxy)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
