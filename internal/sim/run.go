package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// ErrCrashed is returned by Run when an injected crash with
// Faults.CrashExits took the simulated engine down.
var ErrCrashed = errors.New("simulated engine crashed")

// Run serves the simulator on cfg.Addr until ctx ends (graceful stop) or an
// injected crash takes it down (abrupt stop, ErrCrashed).
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid simulator config: %w", err)
	}
	s := New(cfg, WithLogger(log))
	defer s.Close()
	if err := s.LoadWeights(); err != nil {
		return err
	}
	ln, err := Listen(ctx, cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Addr, err)
	}
	return Serve(ctx, ln, s, log)
}

// Listen listens on addr with plain TCP. Go's listeners use Multipath TCP
// where the kernel has it, and criu (4.2) cannot dump an MPTCP socket: a
// process snapshot of the simulator fails with "inet: Unsupported proto
// 262". Plain TCP keeps the simulator snapshottable.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, "tcp", addr)
}

// Serve serves s on ln until ctx ends or s crashes.
func Serve(ctx context.Context, ln net.Listener, s *Simulator, log *slog.Logger) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("simulator serving", "addr", ln.Addr().String(), "model", s.cfg.Model)
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-s.Crashed():
		s.Stop()
		_ = srv.Close()
		return ErrCrashed
	case <-ctx.Done():
	}
	s.Stop()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}
