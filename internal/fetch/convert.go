package fetch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/model-orchestra/operator/internal/convert"
)

// PhaseConverting follows a complete fetch when --convert is set.
const PhaseConverting Phase = "Converting"

// convertModel converts the fetched checkpoint in dir to GGUF, reporting
// the output bytes written as progress. A checkpoint that cannot be
// converted is a verification failure (exit 3, the source is wrong), its
// message naming what is missing.
func convertModel(ctx context.Context, cfg Config, dir string, t *tracker, log *slog.Logger) error {
	typ, err := convert.ParseType(cfg.Convert)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	out := cfg.ConvertOutput
	if out == "" {
		out = convert.OutputName(typ)
	}
	t.bytesDone.Store(0)
	t.mu.Lock()
	t.filesDone = 0
	t.mu.Unlock()
	t.setTotals(1, 0)
	t.setPhase(PhaseConverting, fmt.Sprintf("converting to GGUF %s: %s", typ, out))
	res, err := convert.Run(ctx, convert.Options{Dir: dir, Type: typ, Output: out, Log: log, Progress: func(done, total int64) {
		t.bytesDone.Store(done)
		t.setTotals(1, total)
	}})
	switch {
	case errors.Is(err, convert.ErrUnsupported):
		return fmt.Errorf("%w: cannot convert to GGUF: %w", ErrVerification, err)
	case err != nil:
		return fmt.Errorf("converting to GGUF: %w", err)
	}
	t.bytesDone.Store(res.Size)
	t.setTotals(1, res.Size)
	t.fileDone()
	msg := fmt.Sprintf("converted to %s (%s, %s)", res.Output, res.Type, FormatBytes(res.Size))
	if res.Cached {
		msg = fmt.Sprintf("conversion already complete: %s (%s, %s)", res.Output, res.Type, FormatBytes(res.Size))
	}
	t.setPhase(PhaseComplete, msg)
	log.Info("conversion complete", "output", res.Output, "type", res.Type, "bytes", res.Size, "sha256", res.SHA256, "cached", res.Cached)
	return nil
}
