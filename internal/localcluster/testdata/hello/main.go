// Command hello is the workload of the real-node tests.
//
//	hello                serve "hello from <hostname>" on :8080 ($PORT)
//	hello write PATH     write the hostname to PATH, read it back, exit
//	hello lookup NAME    resolve NAME through the pod's DNS, exit
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	host, _ := os.Hostname()
	switch {
	case len(args) == 2 && args[0] == "write":
		if err := os.WriteFile(args[1], []byte(host), 0o644); err != nil {
			return err
		}
		data, err := os.ReadFile(args[1])
		if err != nil {
			return err
		}
		fmt.Printf("wrote %q to %s\n", data, args[1])
		return nil
	case len(args) == 2 && args[0] == "lookup":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupHost(ctx, args[1])
		if err != nil {
			return err
		}
		fmt.Printf("%s has %v\n", args[1], addrs)
		return nil
	case len(args) == 0:
		port := os.Getenv("PORT")
		if port == "" {
			port = "8080"
		}
		http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", host)
		})
		return http.ListenAndServe(":"+port, nil)
	default:
		return fmt.Errorf("usage: hello [write PATH | lookup NAME]")
	}
}
